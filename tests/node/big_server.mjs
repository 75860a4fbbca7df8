// An MCP server on the official TypeScript SDK, which writes a reply's id LAST
// ({"result":{...},"jsonrpc":"2.0","id":3}), as most public servers do.
//
//   node big_server.mjs stdio
//   node big_server.mjs sse        legacy HTTP+SSE at /sse, on 127.0.0.1
//   node big_server.mjs http       Streamable HTTP at /mcp (stateless), on 127.0.0.1
//
// Tools: big {n_bytes} (a text of n_bytes), echo {text}; resource template
// big://{n_bytes}. An HTTP mode listens on a free port and prints it on stdout.
import http from "node:http";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { SSEServerTransport } from "@modelcontextprotocol/sdk/server/sse.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

function build() {
  const server = new McpServer({ name: "memorizz-node-big", version: "1.0.0" });
  const text = (value) => ({ content: [{ type: "text", text: value }] });
  server.registerTool("big", { inputSchema: { n_bytes: z.number().int() } },
    async ({ n_bytes }) => text("x".repeat(n_bytes)));
  server.registerTool("echo", { inputSchema: { text: z.string() } },
    async ({ text: value }) => text(value));
  server.registerResource("big", new ResourceTemplate("big://{n_bytes}", { list: undefined }),
    { mimeType: "text/plain" },
    async (uri, { n_bytes }) => ({
      contents: [{ uri: uri.href, mimeType: "text/plain", text: "y".repeat(Number(n_bytes)) }],
    }));
  return server;
}

const mode = process.argv[2] ?? "stdio";
if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else {
  const sessions = new Map();
  const listener = http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    if (mode === "sse" && req.method === "GET" && url.pathname === "/sse") {
      const transport = new SSEServerTransport("/messages", res);
      sessions.set(transport.sessionId, transport);
      res.on("close", () => sessions.delete(transport.sessionId));
      await build().connect(transport);
    } else if (mode === "sse" && req.method === "POST" && url.pathname === "/messages") {
      const transport = sessions.get(url.searchParams.get("sessionId"));
      if (transport) await transport.handlePostMessage(req, res);
      else res.writeHead(404).end();
    } else if (mode === "http" && req.method === "POST" && url.pathname === "/mcp") {
      const server = build();
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
      res.on("close", () => { transport.close(); server.close(); });
      await server.connect(transport);
      await transport.handleRequest(req, res);
    } else {
      res.writeHead(req.method === "GET" && url.pathname === "/mcp" ? 405 : 404).end();
    }
  });
  listener.listen(0, "127.0.0.1", () => console.log(listener.address().port));
}
