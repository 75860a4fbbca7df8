// An MCP server on the official TypeScript SDK's experimental tasks API
// (MCP 2025-11-25), over stdio, for tests/daemon/test_socket_tasks.py and
// tests/e2e/test_face_tasks.py:
//
//   node task_server.mjs
//
// Tools: `report` (taskSupport "required": ends a moment after it starts,
// with the text "report: TOPIC"), `sum` ("optional": a + b, as a task or
// not), `hold` ("required": runs until it is cancelled) and `states` (a plain
// tool: every task the server holds, its own id and status, as JSON text).
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import { z } from "zod";

const taskStore = new InMemoryTaskStore();
const server = new McpServer(
  { name: "task-server", version: "1.0.0" },
  {
    capabilities: {
      tools: {},
      tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
    },
    taskStore,
  },
);

const text = (t) => ({ content: [{ type: "text", text: t }] });

function taskTool(name, taskSupport, inputSchema, finish) {
  server.experimental.tasks.registerToolTask(
    name,
    { description: `${name} (a task)`, inputSchema, execution: { taskSupport } },
    {
      createTask: async (args, extra) => {
        const task = await extra.taskStore.createTask({ ttl: 60000, pollInterval: 50 });
        if (finish) {
          setTimeout(() => {
            extra.taskStore
              .storeTaskResult(task.taskId, "completed", text(finish(args)))
              .catch(() => {});
          }, 50);
        }
        return { task };
      },
      getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
      getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
    },
  );
}

taskTool("report", "required", { topic: z.string() }, (a) => `report: ${a.topic}`);
taskTool("sum", "optional", { a: z.number(), b: z.number() }, (a) => String(a.a + a.b));
taskTool("hold", "required", {}, null);

server.registerTool("states", { description: "every task and its status" }, async () => {
  const { tasks } = await taskStore.listTasks();
  return text(JSON.stringify(tasks.map((t) => ({ taskId: t.taskId, status: t.status }))));
});

await server.connect(new StdioServerTransport());
