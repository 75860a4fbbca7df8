// The official TypeScript SDK client, using memorizzd's MCP face through the
// real bridge (memorizzctl --socket API_SOCKET mcp serve), for
// tests/test_face_typescript.py.
//
//   node face_client.mjs PLAN_JSON
//
// PLAN_JSON: {"memorizzctl": path, "socket": API socket, "tool": name,
// "arguments": {...}, "prompt": name or null, "promptArguments": {...},
// "resource": URI to read or null}. The client connects (initialize), lists
// tools, calls the tool, lists and gets the prompt, lists resources and reads
// the one named, then prints one JSON line with what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";

import { bridge, plan, run } from "./face_run.mjs";

const transport = bridge(plan);
// The SDK tells a transport the negotiated version when it has a setter
// (its HTTP transports do; its stdio one does not): keep it to report.
let protocolVersion = null;
transport.setProtocolVersion = (version) => {
  protocolVersion = version;
};
const client = new Client({ name: "memorizz-face-test", version: "1.0.0" });
const texts = (content) => content.filter((c) => c.type === "text").map((c) => c.text);
const seen = {};
await run(client, transport, seen, async () => {
  seen.protocolVersion = protocolVersion;
  seen.serverInfo = client.getServerVersion();
  seen.tools = (await client.listTools()).tools.map((t) => t.name);
  const called = await client.callTool({ name: plan.tool, arguments: plan.arguments });
  seen.call = { text: texts(called.content), isError: called.isError ?? false };
  seen.prompts = (await client.listPrompts()).prompts.map((p) => p.name);
  if (plan.prompt) {
    const got = await client.getPrompt({ name: plan.prompt, arguments: plan.promptArguments });
    seen.prompt = got.messages.flatMap((message) => texts([message.content]));
  }
  seen.resources = (await client.listResources()).resources.map((r) => r.uri);
  if (plan.resource) {
    const read = await client.readResource({ uri: plan.resource });
    seen.read = read.contents.map((c) => c.text ?? null);
  }
});
