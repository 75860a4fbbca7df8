// What the official TypeScript SDK clients here share (battery_client.mjs,
// face_client.mjs, face_features_client.mjs, face_tasks_client.mjs,
// face_typed_call.mjs): their plan (PLAN_JSON, the one argument), the bridge
// they reach memorizzd's MCP face through, and how a run ends: one JSON line
// of what the client saw, how it failed (if it did) in its "error", exit 1.
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

export const plan = JSON.parse(process.argv[2]);

// {"url": ..., "token": ...}: the HTTP bridge (`memorizzctl mcp serve
// --transport streamable-http`, its bearer token); else {"memorizzctl": path,
// "socket": API socket}: the real stdio bridge, `memorizzctl mcp serve`.
export function bridge(plan) {
  return plan.url
    ? new StreamableHTTPClientTransport(new URL(plan.url), {
        requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
      })
    : new StdioClientTransport({
        command: plan.memorizzctl,
        args: ["--socket", plan.socket, "mcp", "serve"],
        stderr: "inherit",
      });
}

// An error as the Python side reads it (an McpError carries the code).
const failure = (error) => ({
  message: String(error?.message ?? error),
  code: error?.code ?? null,
});

// Each of `names` of `steps` in turn: its outcome, or its error, in `seen`.
export async function runSteps(names, steps, seen) {
  for (const name of names) {
    try {
      seen[name] = await steps[name]();
    } catch (error) {
      seen[name] = { error: String(error?.message ?? error), code: error?.code ?? null };
    }
  }
}

// Connect, do `work`, close; then print `seen` (with what it saw so far and
// how it failed, if it did: exit 1).
export async function run(client, transport, seen, work) {
  try {
    await client.connect(transport);
    await work();
  } catch (error) {
    seen.error = failure(error);
    process.exitCode = 1;
  } finally {
    await client.close();
  }
  console.log(JSON.stringify(seen));
}
