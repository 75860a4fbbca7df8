// The official TypeScript SDK client using what MCP carries beside calls,
// through memorizzd's MCP face, for tests/e2e/test_face_typescript_features.py:
//
//   node face_features_client.mjs PLAN_JSON
//
// PLAN_JSON: {"memorizzctl": path, "socket": API socket} (stdio: the real
// bridge, `memorizzctl mcp serve`), or {"url": ..., "token": ...} (Streamable
// HTTP: `memorizzctl mcp serve --transport streamable-http`, bearer token);
// "callLog": the file where the upstream logs start:TAG of `watched`;
// "steps": which of elicit, sample, cancel, listChanged, subscribe, complete
// and resume to run. Each step's outcome (or its error) goes into one JSON line.
import fs from "node:fs";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

import { bridge, plan, run, runSteps } from "./face_run.mjs";

const transport = bridge(plan);
const client = new Client(
  { name: "memorizz-face-features", version: "1.0.0" },
  { capabilities: { elicitation: {}, sampling: {} } },
);
const seen = { asked: [], sampled: [] };

// The callbacks: what a user and a model would answer.
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  seen.asked.push(request.params.message);
  return { action: "accept", content: { name: "Ada" } };
});
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  seen.sampled.push(request.params.messages[0].content.text);
  return {
    model: "ts-model",
    role: "assistant",
    content: { type: "text", text: "hello from TypeScript" },
  };
});

function heard(schema, test = () => true) {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  client.setNotificationHandler(schema, (n) => {
    if (test(n)) resolve(n.params ?? {});
  });
  return promise;
}

const texts = (result) => ({
  text: result.content.map((c) => c.text),
  isError: result.isError ?? false,
});

async function untilLogged(line) {
  // the upstream has the call: it logged its start (a condition, not a time)
  while (!(fs.existsSync(plan.callLog) && fs.readFileSync(plan.callLog, "utf8").split("\n").includes(line))) {
    await new Promise((r) => setTimeout(r, 20));
  }
}

const steps = {
  async elicit() {
    return texts(await client.callTool({ name: "ask__ask_name", arguments: {} }));
  },
  async sample() {
    return texts(await client.callTool({ name: "ask__sample", arguments: { prompt: "say hi" } }));
  },
  async cancel() {
    const tag = `ts-cancel-${plan.url ? "http" : "stdio"}`;
    const abort = new AbortController();
    const call = client.callTool(
      { name: "alpha__watched", arguments: { seconds: 60, tag } },
      undefined,
      { signal: abort.signal },
    );
    await untilLogged(`start:${tag}`);
    abort.abort("the user gave up");
    let aborted = null;
    try {
      await call;
    } catch (error) {
      aborted = String(error?.message ?? error);
    }
    await untilLogged(`cancelled:${tag}`); // the upstream heard it
    const after = texts(await client.callTool({ name: "alpha__echo", arguments: { text: "after" } }));
    return { aborted, after };
  },
  async listChanged() {
    const changed = heard(ToolListChangedNotificationSchema);
    const before = new Set((await client.listTools()).tools.map((t) => t.name));
    await client.callTool({ name: "alpha__change_tools", arguments: {} });
    await changed;
    return (await client.listTools()).tools.map((t) => t.name).filter((n) => !before.has(n));
  },
  async subscribe() {
    const updated = heard(ResourceUpdatedNotificationSchema, (n) => n.params.uri === "feat://watched");
    await client.subscribeResource({ uri: "feat://watched" });
    const touched = texts(await client.callTool({ name: "feat__touch", arguments: { uri: "feat://watched" } }));
    const note = plan.awaitUpdate === false ? null : await updated;
    await client.unsubscribeResource({ uri: "feat://watched" });
    return { touched, updated: note?.uri ?? null };
  },
  async resume() {
    // through a relay that cuts the connection mid-call (tests/faults.py):
    // the SDK comes back with Last-Event-ID; every step once, then the answer
    const progress = [];
    const result = await client.callTool(
      { name: "alpha__progressing", arguments: { steps: 20 } },
      undefined,
      { onprogress: (p) => progress.push(p.progress), resetTimeoutOnProgress: true },
    );
    return { progress, ...texts(result) };
  },
  async complete() {
    const done = await client.complete({
      ref: { type: "ref/prompt", name: "feat__pick" },
      argument: { name: "color", value: "gr" },
    });
    return done.completion.values;
  },
};

await run(client, transport, seen, async () => {
  seen.capabilities = Object.keys(client.getServerCapabilities() ?? {}).sort();
  await runSteps(plan.steps, steps, seen);
});
