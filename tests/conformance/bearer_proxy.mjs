// A test-only loopback proxy that adds `Authorization: Bearer TOKEN` to every request.
//
//   node bearer_proxy.mjs LISTEN_PORT TARGET_PORT TOKEN_FILE
//
// The MCP conformance suite's `server --url` mode has no option to send a header, and
// `memorizzctl mcp serve --transport streamable-http` rightly answers 401 without its
// bearer token. scripts/conformance-face therefore points the suite at this proxy, which
// listens on 127.0.0.1:LISTEN_PORT and forwards every request, unchanged but for that
// header, to 127.0.0.1:TARGET_PORT (the HTTP bridge). Bodies stream both ways (an SSE
// answer passes through as it comes). The bridge keeps all its defaults.
//
// Host and Origin: a value naming this proxy (localhost or 127.0.0.1 on LISTEN_PORT) is
// rewritten to name the bridge's port, as if the client had called the bridge itself;
// any other value passes unchanged, so the bridge's DNS-rebinding checks still see what
// the suite sent (the dns-rebinding-protection scenario). Loopback only, both sides.
// Prints "listening" on stdout when ready.

import { readFileSync } from "node:fs";
import http from "node:http";

const [listenPort, targetPort, tokenFile] = process.argv.slice(2);
if (!listenPort || !targetPort || !tokenFile) {
  console.error("usage: bearer_proxy.mjs LISTEN_PORT TARGET_PORT TOKEN_FILE");
  process.exit(2);
}
const token = readFileSync(tokenFile, "utf8").trim();
const ours = new Set([`127.0.0.1:${listenPort}`, `localhost:${listenPort}`]);

function retarget(value) {
  // "localhost:LISTEN" or "http://localhost:LISTEN" -> the same on TARGET; else unchanged.
  if (typeof value !== "string") return value;
  const scheme = value.startsWith("http://") ? "http://" : "";
  const netloc = value.slice(scheme.length).toLowerCase();
  if (!ours.has(netloc)) return value;
  return `${scheme}${netloc.slice(0, netloc.lastIndexOf(":"))}:${targetPort}`;
}

// One connection to the bridge per client connection, kept alive as the client's is: the
// bridge sees the same sequence of requests per connection as if the client called it.
const agents = new WeakMap();
function agentFor(socket) {
  let agent = agents.get(socket);
  if (agent === undefined) {
    agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    agents.set(socket, agent);
    socket.on("close", () => agent.destroy());
  }
  return agent;
}

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  headers.host = retarget(headers.host);
  if (headers.origin !== undefined) headers.origin = retarget(headers.origin);
  const upstream = http.request(
    {
      host: "127.0.0.1",
      port: Number(targetPort),
      method: req.method,
      path: req.url,
      headers,
      agent: agentFor(req.socket),
    },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      res.flushHeaders();
      answer.pipe(res);
    },
  );
  upstream.on("error", (err) => {
    if (!res.headersSent) {
      res.writeHead(502, { "content-type": "text/plain" });
    }
    res.end(`bearer_proxy: ${err.message}\n`);
  });
  res.on("close", () => upstream.destroy());
  req.pipe(upstream);
});

server.listen(Number(listenPort), "127.0.0.1", () => {
  console.log("listening");
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => process.exit(0));
}
