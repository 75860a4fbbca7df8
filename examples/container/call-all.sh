#!/bin/sh
# call-all SERVER TOOL: call TOOL of SERVER with {"text": ...} through each client
# of memorizzd in turn (the Python thin client, Node.js, the shell), on the
# profile socket $MEMORIZZ_SOCKET. examples/container/Dockerfile's command;
# tests/e2e/test_container_example.py runs it on the host against a real daemon.
set -eu
server=$1
tool=$2

echo "python:"
python3 - "$server" "$tool" <<'PY'
import sys

from memorizz import Client

server, tool = sys.argv[1:]
with Client() as client:
    client.hello("call-all (python)")
    result = client.call_tool(server, tool, {"text": "hello from python"})
    print(result.content[0]["text"])
PY

echo "node:"
node --input-type=module - "$server" "$tool" <<'JS'
const [server, tool] = process.argv.slice(2);
const { Client } = await import(process.env.MEMORIZZ_NODE_CLIENT ?? "/opt/memorizz/node/memorizz.mjs");
const client = new Client();
await client.hello("call-all (node)");
const result = await client.callTool(server, tool, { text: "hello from node" });
console.log(result.content[0].text);
client.close();
JS

echo "sh:"
mz call "$server" "$tool" '{"text": "hello from sh"}'
