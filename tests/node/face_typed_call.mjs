// The official TypeScript SDK client calling one tool through memorizzd's MCP
// face (the real bridge, `memorizzctl mcp serve`), for
// tests/e2e/test_face_typed_results.py:
//
//   node face_typed_call.mjs PLAN_JSON
//
// PLAN_JSON: {"memorizzctl": path, "socket": API socket, "tool": name}. Prints
// one JSON line: the tool's output schema as listed, and the call's result, or
// the error the SDK raised (it checks structuredContent against the schema).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";

import { bridge, plan, run } from "./face_run.mjs";

const transport = bridge(plan);
const client = new Client({ name: "memorizz-face-typed", version: "1.0.0" });
const seen = {};
await run(client, transport, seen, async () => {
  const { tools } = await client.listTools();
  seen.outputSchema = tools.find((t) => t.name === plan.tool)?.outputSchema ?? null;
  try {
    seen.result = await client.callTool({ name: plan.tool, arguments: {} });
  } catch (error) {
    seen.error = { code: error.code ?? null, message: String(error.message) };
  }
});
