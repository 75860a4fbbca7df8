// The official TypeScript SDK client calling tools as tasks (MCP 2025-11-25)
// through memorizzd's MCP face and the real bridge, for
// tests/e2e/test_face_tasks.py:
//
//   node face_tasks_client.mjs PLAN_JSON
//
// PLAN_JSON: {"memorizzctl": path, "socket": API socket}. It lists the tools,
// runs `report` (task required) and `sum` (task optional) as tasks with the
// SDK's experimental tasks API (callToolStream: create, poll tasks/get, then
// tasks/result), starts `hold` and cancels it (tasks/cancel), lists its tasks,
// and prints one JSON line of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  TaskStatusNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

import { bridge, plan, run } from "./face_run.mjs";

const transport = bridge(plan);
const client = new Client({ name: "memorizz-face-tasks", version: "1.0.0" });
const seen = { statuses: [] };
client.setNotificationHandler(TaskStatusNotificationSchema, (n) => seen.statuses.push({ taskId: n.params.taskId, status: n.params.status }),
);

async function asTask(name, args) {
  const outcome = { created: null, statuses: [], text: null, error: null };
  for await (const message of client.experimental.tasks.callToolStream(
    { name, arguments: args },
    CallToolResultSchema,
    { task: { ttl: 60000 } },
  )) {
    if (message.type === "taskCreated") outcome.created = message.task.taskId;
    if (message.type === "taskStatus") outcome.statuses.push(message.task.status);
    if (message.type === "result") outcome.text = message.result.content.map((c) => c.text);
    if (message.type === "error") outcome.error = String(message.error?.message ?? message.error);
  }
  return outcome;
}

await run(client, transport, seen, async () => {
  seen.tasksCapability = client.getServerCapabilities()?.tasks ?? null;
  const tools = (await client.listTools()).tools;
  seen.taskSupport = Object.fromEntries(
    tools.map((t) => [t.name, t.execution?.taskSupport ?? null]),
  );
  seen.report = await asTask("report", { topic: "otters" });
  seen.sum = await asTask("sum", { a: 2, b: 3 });
  const created = await client.request(
    { method: "tools/call", params: { name: "hold", arguments: {}, task: { ttl: 60000 } } },
    CreateTaskResultSchema,
  );
  seen.hold = created.task.taskId;
  seen.cancelled = (await client.experimental.tasks.cancelTask(seen.hold)).status;
  seen.afterCancel = (await client.experimental.tasks.getTask(seen.hold)).status;
  seen.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
});
