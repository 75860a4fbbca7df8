"""Egress: the only way the daemon reaches the network (besides the SDK adapter
handing our client to the MCP SDK).

``urls`` (the static URL and host policy), ``addresses`` (the deny table),
``backend`` (resolve, check every address, dial the checked one),
``transport`` (per-request policy and the pinned pool), ``replies`` (a refusal
fails one MCP request), ``client`` (the factory that puts them together),
``limits`` (the byte caps on what comes in, on every transport, stdio too) and
``envelope`` (the scanner that finds an oversize message's ``id``).
"""
