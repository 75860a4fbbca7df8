// An MCP server on the official TypeScript SDK's experimental tasks API
// (MCP 2025-11-25), for tests/daemon/test_socket_tasks.py and
// tests/e2e/test_face_tasks.py, over stdio or Streamable HTTP:
//
//   node task_server.mjs            (stdio)
//   node task_server.mjs http       (127.0.0.1, a free port: prints "PORT N")
//
// Over HTTP each session (initialize) gets a server of its own; the task
// store is one, so a session that reconnects still finds its tasks.
//
// Tools: `report` (taskSupport "required": ends a moment after it starts,
// with the text "report: TOPIC"), `sum` ("optional": a + b, as a task or
// not), `hold` ("required": runs until it is cancelled) and `states` (a plain
// tool: every task the server holds, its own id and status, as JSON text).
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { randomUUID } from "node:crypto";
import http from "node:http";
import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import { z } from "zod";

const taskStore = new InMemoryTaskStore();
const text = (t) => ({ content: [{ type: "text", text: t }] });

function makeServer() {
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
  // `late_hold`: `hold`, its task made only after `ms` (a call still in flight
  // when the test reloads the daemon)
  server.experimental.tasks.registerToolTask(
    "late_hold",
    {
      description: "late_hold (a task)",
      inputSchema: { ms: z.number() },
      execution: { taskSupport: "required" },
    },
    {
      createTask: async (args, extra) => {
        await new Promise((resolve) => setTimeout(resolve, args.ms));
        const task = await extra.taskStore.createTask({ ttl: 60000, pollInterval: 50 });
        return { task };
      },
      getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
      getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
    },
  );

  server.registerTool("states", { description: "every task and its status" }, async () => {
    const { tasks } = await taskStore.listTasks();
    return text(JSON.stringify(tasks.map((t) => ({ taskId: t.taskId, status: t.status }))));
  });

  return server;
}

if (process.argv[2] !== "http") {
  await makeServer().connect(new StdioServerTransport());
} else {
  const sessions = new Map();
  const body = (req) =>
    new Promise((resolve) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const text = Buffer.concat(chunks).toString();
        resolve(text ? JSON.parse(text) : undefined);
      });
    });
  const listener = http.createServer(async (req, res) => {
    const parsed = req.method === "POST" ? await body(req) : undefined;
    let transport = sessions.get(req.headers["mcp-session-id"]);
    if (!transport && isInitializeRequest(parsed)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => sessions.set(id, transport),
      });
      transport.onclose = () => sessions.delete(transport.sessionId);
      await makeServer().connect(transport);
    }
    if (!transport) {
      res.writeHead(404, { "content-type": "application/json" }).end(
        JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } }),
      );
      return;
    }
    await transport.handleRequest(req, res, parsed);
  });
  listener.listen(0, "127.0.0.1", () => {
    process.stdout.write(`PORT ${listener.address().port}\n`);
  });
}
