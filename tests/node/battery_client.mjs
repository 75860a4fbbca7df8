// The official TypeScript SDK client driving one MCP server the way a user's
// configuration would, for tests/e2e/test_face_clients_battery.py, which runs
// it once against the server itself and once through memorizzd's MCP face,
// and compares what the client saw:
//
//   node battery_client.mjs PLAN_JSON
//
// PLAN_JSON: {"command": exe, "args": [...]} (stdio: the server itself, or
// the real bridge, `memorizzctl mcp serve`), or {"url": ..., "token": ...}
// (Streamable HTTP: `memorizzctl mcp serve --transport streamable-http`);
// "steps": which steps to run; "capabilities": the client's (default:
// elicitation and sampling). Each step's outcome (or its error) goes into
// one JSON line.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

import { bridge, plan, run, runSteps } from "./face_run.mjs";

const transport = plan.url
  ? bridge(plan)
  : new StdioClientTransport({ command: plan.command, args: plan.args, stderr: "ignore" });
const client = new Client(
  { name: "memorizz-battery", version: "1.0.0" },
  { capabilities: plan.capabilities ?? { elicitation: {}, sampling: {} } },
);
const seen = { asked: [], sampled: [], logs: [] };

client.setRequestHandler(ElicitRequestSchema, async (request) => {
  seen.asked.push(request.params.message);
  return { action: plan.elicitAction ?? "accept", content: { name: "Ada", check: true } };
});
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  seen.sampled.push(request.params.messages[0].content.text);
  return { model: "ts-model", role: "assistant", content: { type: "text", text: "sampled" } };
});
let logged;
const firstLog = new Promise((r) => (logged = r));
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
  seen.logs.push(n.params.level);
  logged(n.params);
});

// What a user notices of a result: everything but the daemon's own _meta.
const plain = (value) => JSON.parse(JSON.stringify(value, (k, v) => (k === "_meta" ? undefined : v)));
const call = async (name, args, options) => plain(await client.callTool({ name, arguments: args }, undefined, options));
const within = (promise, ms, what) =>
  Promise.race([promise, new Promise((_, no) => setTimeout(() => no(new Error(`no ${what} in ${ms} ms`)), ms))]);

const steps = {
  async init() {
    return {
      capabilities: client.getServerCapabilities(),
      instructions: client.getInstructions() ?? null,
    };
  },
  async tools() {
    const { tools, nextCursor } = await client.listTools();
    return {
      nextCursor: nextCursor ?? null,
      tools: Object.fromEntries(tools.map((t) => [t.name, plain(t)])),
    };
  },
  echo: () => call("echo", { message: "héllo ✓" }),
  sum: () => call("get-sum", { a: 2, b: 40 }),
  structured: () => call("get-structured-content", { location: "New York" }),
  image: () => call("get-tiny-image", {}),
  annotated: () => call("get-annotated-message", { messageType: "error", includeImage: true }),
  links: () => call("get-resource-links", { count: 2 }),
  reference: () => call("get-resource-reference", { resourceType: "Text", resourceId: 2 }),
  badArgs: () => call("get-sum", { a: "two" }),
  async unknownTool() {
    try {
      return await call("no-such-tool", {});
    } catch (error) {
      return { error: error.code ?? null };
    }
  },
  async progress() {
    const progress = [];
    const result = await call(
      "trigger-long-running-operation",
      { duration: 1, steps: 3 },
      { onprogress: (p) => progress.push([p.progress, p.total ?? null]), resetTimeoutOnProgress: true },
    );
    return { progress, result };
  },
  async abort() {
    const abort = new AbortController();
    const running = client.callTool(
      { name: "trigger-long-running-operation", arguments: { duration: 30, steps: 30 } },
      undefined,
      { signal: abort.signal, onprogress: () => abort.abort("given up") },
    );
    let aborted = null;
    try {
      await running;
    } catch (error) {
      aborted = error?.name ?? "error";
    }
    return { aborted: aborted !== null, after: await call("echo", { message: "after" }) };
  },
  async resources() {
    const listed = await client.listResources();
    const templates = await client.listResourceTemplates();
    const first = listed.resources[0];
    return {
      nextCursor: listed.nextCursor ?? null,
      count: listed.resources.length,
      first: plain(first),
      read: plain(await client.readResource({ uri: first.uri })),
      templates: plain(templates.resourceTemplates),
      fromTemplate: plain(await client.readResource({ uri: "demo://resource/dynamic/text/7" })),
    };
  },
  async prompts() {
    const { prompts } = await client.listPrompts();
    return {
      prompts: plain(prompts),
      simple: plain(await client.getPrompt({ name: "simple-prompt" })),
      args: plain(await client.getPrompt({ name: "args-prompt", arguments: { city: "Paris", state: "IDF" } })),
      resource: plain(
        await client.getPrompt({ name: "resource-prompt", arguments: { resourceType: "Text", resourceId: "3" } }),
      ),
    };
  },
  async complete() {
    const department = await client.complete({
      ref: { type: "ref/prompt", name: "completable-prompt" },
      argument: { name: "department", value: "S" },
    });
    const named = await client.complete({
      ref: { type: "ref/prompt", name: "completable-prompt" },
      argument: { name: "name", value: "" },
      context: { arguments: { department: "Sales" } },
    });
    const template = await client.complete({
      ref: { type: "ref/resource", uri: "demo://resource/dynamic/text/{resourceId}" },
      argument: { name: "resourceId", value: "1" },
    });
    return plain({ department: department.completion, named: named.completion, template: template.completion });
  },
  async logging() {
    await client.setLoggingLevel("debug");
    const toggled = await call("toggle-simulated-logging", {});
    const first = await within(firstLog, 15000, "log message");
    await call("toggle-simulated-logging", {});
    return { toggled: toggled.isError ?? false, level: typeof first.level, data: typeof first.data };
  },
  async ping() {
    return plain(await client.ping());
  },
  async elicit() {
    return call("trigger-elicitation-request", {});
  },
  async sample() {
    return call("trigger-sampling-request", { prompt: "say hi", maxTokens: 5 });
  },
};

await run(client, transport, seen, () => runSteps(plan.steps, steps, seen));
