// clients/node/memorizz.mjs against a real daemon, for
// tests/e2e/test_client_node.py.
//
//   MEMORIZZ_SOCKET=... node node_client.mjs SERVER GATE_PATH
//
// SERVER is tests/mcp_server.py's stdio server. Prints {"held": true} once the
// listing asked after the gate calls is answered, then one JSON line with what
// it saw: hello, the tools, an echo, the error of an unknown server, then 50
// `gate` calls pipelined on the one connection (they answer once GATE_PATH
// exists: the test creates it when it sees them all in flight), a tools/list
// sent after them that is answered first, and 50 echoes of distinct texts at once.
import * as mz from "../../clients/node/memorizz.mjs";

const [server, gatePath] = process.argv.slice(2);
const seen = {};
const client = new mz.Client();
let connections = 0;
const connect = client.connect.bind(client);
client.connect = () => {
  if (!client._socket && !client._connecting) connections += 1;
  return connect();
};
try {
  seen.socketPath = client.socketPath;
  seen.hello = await client.hello();
  seen.tools = (await client.listTools(server)).map((t) => t.name);
  seen.echo = await client.callTool(server, "echo", { text: "hi from node" });
  seen.failed = await client.callTool(server, "fail", { reason: "on purpose" });
  try {
    await client.callTool("nope", "echo", { text: "x" });
    seen.unknown = "no error";
  } catch (err) {
    seen.unknown = {
      name: err.name,
      isNotFound: err instanceof mz.NotFoundError,
      isRemote: err instanceof mz.RemoteError,
      isMemorizz: err instanceof mz.MemorizzError,
      code: err.code,
      reason: err.reason,
      data: err.data,
      message: err.message,
    };
  }
  try {
    await client.call("tools/frobnicate");
  } catch (err) {
    seen.method = { name: err.name, reason: err.reason };
  }
  const order = [];
  const gates = Array.from({ length: 50 }, (_, i) =>
    client.callTool(server, "gate", { path: gatePath }).then((r) => {
      order.push(`gate${i}`);
      return r.content[0].text;
    }),
  );
  // served from the daemon's tools cache, not queued behind the server's work
  const after = client.listTools(server).then((tools) => {
    order.push("tools");
    return tools.length;
  });
  seen.after = await after;
  process.stdout.write('{"held": true}\n'); // the test opens the gate after this line
  seen.gates = await Promise.all(gates);
  seen.firstAnswered = order[0];
  const texts = Array.from({ length: 50 }, (_, i) => `text-${i}`);
  const echoes = await Promise.all(texts.map((text) => client.callTool(server, "echo", { text })));
  seen.echoesMatch = echoes.every((r, i) => r.content[0].text === texts[i]);
  seen.connections = connections;
  // log lines, as the hello asked, on this connection and on the next one
  // (the hello is said again first when the client connects anew)
  const heard = [];
  client.onNotification = (message) => {
    if (message.method === "notifications/message") heard.push(message.params.data);
  };
  await client.hello("node-client-test", { logging: {} });
  await client.callTool(server, "logged", { text: "first connection" });
  client.close();
  await client.callTool(server, "logged", { text: "second connection" });
  seen.heard = heard;
  const steps = [];
  client.onNotification = (message) => {
    if (message.method === "notifications/progress") steps.push(message.params.progress);
  };
  await client.callTool(server, "progressing", { steps: 3 }, { progressToken: "p1" });
  seen.progress = steps;
  seen.defaults = {
    env: mz.defaultSocketPath({ MEMORIZZ_SOCKET: "/given.sock" }),
    root: mz.defaultSocketPath({}, 0, () => false),
    user: mz.defaultSocketPath({ XDG_RUNTIME_DIR: "/run/user/1000" }, 1000, () => false),
    bare: mz.defaultSocketPath({}, 1000, () => false),
    system: mz.defaultSocketPath({}, 1000, (p) => p === mz.SYSTEM_SOCKET),
  };
} finally {
  client.close();
}
try {
  await new mz.Client("/nonexistent/memorizzd.sock").hello();
} catch (err) {
  seen.unreachable = { name: err.name, isUnreachable: err instanceof mz.DaemonUnreachableError };
}
process.stdout.write(JSON.stringify(seen) + "\n");
