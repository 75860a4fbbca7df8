// memorizz: a dependency-free Node.js client for the memorizzd socket API.
//
// The protocol (docs/protocol.md): JSON-RPC 2.0, one JSON message per line, on
// a Unix stream socket. Requests are pipelined on one connection: each call
// gets a new id, and its reply, which may come back in any order, is matched
// by that id. Errors are thrown as MemorizzError subclasses, one per error
// code, with the stable `reason` (data.reason) to branch on.
//
//   import { Client } from "./memorizz.mjs";
//   const client = new Client();               // $MEMORIZZ_SOCKET or the default path
//   await client.hello();
//   const { content } = await client.callTool("notes", "search", { query: "x" });
//   client.close();
//
// Node.js 18 or later; nothing but node:net, node:fs and node:path.

import { existsSync } from "node:fs";
import net from "node:net";
import path from "node:path";

export const PROTOCOL_VERSION = 1;
/** The largest request line the daemon reads, without its newline (1 MiB). */
export const MAX_FRAME = 1 << 20;
/** The system daemon's operator socket (root's default). */
export const SYSTEM_SOCKET = "/run/memorizzd/memorizzd.sock";
export const VERSION = "0.1.0";

/** The directory of the daemon's sockets for this user when nothing says otherwise. */
export function defaultRuntimeDir(env = process.env, uid = process.geteuid()) {
  if (uid === 0) return "/run/memorizzd";
  if (env.XDG_RUNTIME_DIR) return path.join(env.XDG_RUNTIME_DIR, "memorizzd");
  return `/tmp/memorizzd-${uid}`;
}

/**
 * The operator socket, as the Python client finds it: $MEMORIZZ_SOCKET; else
 * the user's own (/run/memorizzd/ as root, $XDG_RUNTIME_DIR/memorizzd/, or
 * /tmp/memorizzd-UID/), unless only the system daemon's exists. An agent is
 * given its profile's socket (PROFILE/api.sock): set MEMORIZZ_SOCKET to it.
 */
export function defaultSocketPath(env = process.env, uid = process.geteuid(), exists = existsSync) {
  if (env.MEMORIZZ_SOCKET) return env.MEMORIZZ_SOCKET;
  const own = path.join(defaultRuntimeDir(env, uid), "memorizzd.sock");
  if (!exists(own) && exists(SYSTEM_SOCKET)) return SYSTEM_SOCKET;
  return own;
}

// --- errors ------------------------------------------------------------------

/** Base of every error this module throws. */
export class MemorizzError extends Error {
  constructor(message, { code = null, reason = null, data = {} } = {}) {
    super(message);
    this.name = new.target.name;
    /** The JSON-RPC error code (null on the client's own errors). */
    this.code = code;
    /** The stable snake_case word to branch on (docs/protocol.md, "Errors"). */
    this.reason = reason;
    /** The error's data, without `reason` (server, retry_after_s, ...). */
    this.data = data;
  }
}

/** An error the daemon answered. */
export class RemoteError extends MemorizzError {}
export class ParseError extends RemoteError {} // -32700 parse_error
export class InvalidRequestError extends RemoteError {} // -32600 invalid_request, frame_too_large
export class MethodNotFoundError extends RemoteError {} // -32601 method_not_found
export class InvalidParamsError extends RemoteError {} // -32602 invalid_params, invalid_config
export class InternalError extends RemoteError {} // -32603 internal
export class UnsupportedProtocolError extends RemoteError {} // -32000 unsupported_protocol
export class PermissionDeniedError extends RemoteError {} // -32001 permission_denied, tool_blocked, egress ...
export class NotFoundError extends RemoteError {} // -32002 unknown_server, not_found
export class UnavailableError extends RemoteError {} // -32003 server_unavailable, overloaded, ... (retry)
export class AuthRequiredError extends RemoteError {} // -32004 authorization_required, login_required, ...
export class DeadlineExceededError extends RemoteError {} // -32005 timeout, idle_timeout (retry)
export class UpstreamError extends RemoteError {} // -32006 upstream_error
export class TooLargeError extends RemoteError {} // -32007 result_too_large
export class ConflictError extends RemoteError {} // -32008 server_exists, not_approved
export class ApprovalRequiredError extends RemoteError {} // -32009 approval_required
export class LoginError extends RemoteError {} // -32010 login_failed, invalid_state

/** The socket could not be reached, or the connection broke (client side). */
export class DaemonUnreachableError extends MemorizzError {}
/** A reply that is not JSON-RPC, or a request too large to send (client side). */
export class ProtocolError extends MemorizzError {}

export const ERROR_CLASSES = Object.freeze({
  [-32700]: ParseError,
  [-32600]: InvalidRequestError,
  [-32601]: MethodNotFoundError,
  [-32602]: InvalidParamsError,
  [-32603]: InternalError,
  [-32000]: UnsupportedProtocolError,
  [-32001]: PermissionDeniedError,
  [-32002]: NotFoundError,
  [-32003]: UnavailableError,
  [-32004]: AuthRequiredError,
  [-32005]: DeadlineExceededError,
  [-32006]: UpstreamError,
  [-32007]: TooLargeError,
  [-32008]: ConflictError,
  [-32009]: ApprovalRequiredError,
  [-32010]: LoginError,
});

/** The error for a reply's `error` member; an unknown code is a RemoteError. */
export function errorFromWire(error) {
  const { reason = null, ...data } = error.data ?? {};
  const Cls = ERROR_CLASSES[error.code] ?? RemoteError;
  return new Cls(String(error.message), { code: error.code, reason, data });
}

// --- the client --------------------------------------------------------------

/**
 * One connection, many requests in flight on it. Methods return promises;
 * replies are matched to requests by id, whatever their order. The connection
 * opens at the first request and again after the daemon closed it.
 */
export class Client {
  constructor(socketPath = defaultSocketPath(), { onNotification = null } = {}) {
    this.socketPath = socketPath;
    /** Called with each notification the daemon sends (progress, log messages). */
    this.onNotification = onNotification;
    this._socket = null;
    this._connecting = null;
    this._nextId = 1;
    this._pending = new Map(); // id -> {resolve, reject}
    this._chunks = [];
    /** The last hello's params: said again first on every new connection. */
    this._hello = null;
  }

  /** Open the connection now (requests open it when needed). */
  connect() {
    if (this._socket) return Promise.resolve(this);
    if (this._connecting) return this._connecting;
    this._connecting = new Promise((resolve, reject) => {
      const socket = net.createConnection({ path: this.socketPath });
      const failed = (err) => {
        this._connecting = null;
        const why = err.code === "EACCES"
          ? "permission denied: ask for the memorizzd operators group, or use your agent socket"
          : `${err.message}; is memorizzd running? set MEMORIZZ_SOCKET to its socket`;
        // memorizzctl's reasons for the same failures (docs/protocol.md, "Errors");
        // the system's error code (ENOENT, ECONNREFUSED, ...) is data.errno
        reject(new DaemonUnreachableError(`cannot reach memorizzd at ${this.socketPath}: ${why}`, {
          reason: err.code === "EACCES" ? "socket_permission_denied" : "daemon_unreachable",
          data: { socket: this.socketPath, errno: err.code ?? null },
        }));
      };
      socket.once("error", failed);
      socket.once("connect", () => {
        socket.off("error", failed);
        socket.setNoDelay?.(true);
        socket.on("data", (chunk) => this._receive(chunk));
        socket.on("error", (err) => this._broken(socket, err.message));
        socket.on("close", () => this._broken(socket, "the daemon closed the connection"));
        this._socket = socket;
        this._connecting = null;
        // A new connection (the daemon closed an idle one, say) starts without
        // the capabilities a hello declared on the old one: say it again,
        // first, so that log lines and asks keep coming.
        if (this._hello) this._send("daemon/hello", this._hello).catch(() => {});
        resolve(this);
      });
    });
    return this._connecting;
  }

  /** Close the connection; requests still in flight fail. */
  close() {
    const socket = this._socket;
    if (!socket) return;
    this._broken(socket, "the client closed the connection");
    socket.destroy();
  }

  /** Send one request (any method of docs/protocol.md) and resolve with its result. */
  async call(method, params = {}) {
    if (!this._socket) await this.connect();
    return this._send(method, params);
  }

  _send(method, params) {
    const id = this._nextId++;
    const line = JSON.stringify({ jsonrpc: "2.0", id, method, params });
    if (Buffer.byteLength(line) > MAX_FRAME) {
      throw new ProtocolError(`request larger than ${MAX_FRAME} bytes`, { reason: "frame_too_large" });
    }
    const reply = new Promise((resolve, reject) => this._pending.set(id, { resolve, reject }));
    this._socket.write(line + "\n");
    return reply;
  }

  /**
   * Check that both sides speak the same protocol version, and declare what
   * this client takes (`{logging: {level}}` for log lines); said again on
   * every new connection.
   */
  async hello(client = `memorizz-node ${VERSION}`, capabilities = {}) {
    const params = { protocol_version: PROTOCOL_VERSION, client, capabilities };
    const result = await this.call("daemon/hello", params);
    this._hello = params;
    return result;
  }

  /** A server's tools (MCP's spelling: name, description, inputSchema, ...). */
  async listTools(server, { refresh = false } = {}) {
    return (await this.call("tools/list", { server, refresh })).tools;
  }

  /**
   * Call a tool: resolves with MCP's result ({content, structuredContent?,
   * isError?}); a tool that failed answers isError: true, not an exception.
   */
  callTool(server, name, args = {}, { timeoutS = null, progressToken = null } = {}) {
    const params = { server, name, arguments: args };
    if (timeoutS !== null) params.timeout_s = timeoutS;
    if (progressToken !== null) params.progress_token = progressToken;
    return this.call("tools/call", params);
  }

  _receive(chunk) {
    let start = 0;
    let end = chunk.indexOf(10);
    while (end >= 0) {
      this._chunks.push(chunk.subarray(start, end));
      const line = Buffer.concat(this._chunks);
      this._chunks = [];
      if (line.length) this._line(line);
      start = end + 1;
      end = chunk.indexOf(10, start);
    }
    if (start < chunk.length) this._chunks.push(chunk.subarray(start));
  }

  _line(raw) {
    let message;
    try {
      message = JSON.parse(raw.toString("utf8"));
    } catch {
      this._failAll(new ProtocolError("the daemon sent a line that is not JSON"));
      this._socket?.destroy();
      return;
    }
    if (message === null || typeof message !== "object") return;
    if (typeof message.method === "string") {
      // A notification (progress, log messages) or a request the client did
      // not ask for in daemon/hello: the former go to onNotification.
      if (message.id === undefined || message.id === null) this.onNotification?.(message);
      return;
    }
    if (message.id === null || message.id === undefined) {
      // The connection is refused or closed (permission_denied, overloaded,
      // idle_timeout, frame_too_large): every request in flight has lost it.
      if (message.error) this._failAll(errorFromWire(message.error));
      return;
    }
    const waiter = this._pending.get(message.id);
    if (!waiter) return;
    this._pending.delete(message.id);
    if (message.error) waiter.reject(errorFromWire(message.error));
    else waiter.resolve(message.result);
  }

  _broken(socket, why) {
    if (socket !== this._socket) return; // an earlier connection's last words
    this._socket = null;
    this._chunks = [];
    this._failAll(new DaemonUnreachableError(`connection to memorizzd at ${this.socketPath} broke: ${why}`, {
      reason: "daemon_unreachable",
      data: { socket: this.socketPath },
    }));
  }

  _failAll(error) {
    const pending = [...this._pending.values()];
    this._pending.clear();
    for (const { reject } of pending) reject(error);
  }
}
