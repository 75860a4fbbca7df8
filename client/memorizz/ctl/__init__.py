"""memorizzctl: the operator's command line for memorizzd.

Every command is parse -> one ``Client`` call -> render -> exit status::

    run.py        main(): parse, run one command, map its error to an exit status
    oneshot.py    a plain ``mcp call`` from built-in modules only (no argparse,
                  no msgspec): what a script pays per call is the interpreter
    serve.py      ``mcp serve``: an MCP client's stdio bridged to the daemon's
                  MCP socket (mcp.sock), a byte pump from built-in modules only
    parser.py     the argparse tree, each command's parser built when chosen;
                  add.py: ``mcp add``'s options and ServerSpec
    args.py       argparse converters (KEY=VALUE, JSON objects, positive numbers)
    commands.py   one function per command: (Client, args) -> exit status
    login.py      ``mcp login``: the loopback listener and the pasted callback
    render.py     pure renderers, result structs in, text out (text.py: tables, ages)
    exits.py      the exit statuses, and which error earns which

Commands::

    memorizzctl mcp list | add | remove | status | test | login | logout
    memorizzctl mcp tools | resources | templates | prompts
    memorizzctl mcp call [--task] | read | prompt | complete | watch
    memorizzctl mcp task get | result | cancel | list
    memorizzctl mcp approvals | approve | reject | cancel | resume | wait
    memorizzctl mcp serve (stdio bridge for MCP clients)
    memorizzctl audit
    memorizzctl daemon status
    memorizzctl vault rotate [--new-key]
    memorizzctl ping [SERVER]

Global options (accepted before or after the command; the later one wins):
``--socket PATH`` (default ``$MEMORIZZ_SOCKET``, else the per-user default) and
``--json`` (the result struct itself, under its wire names).

Standard library, msgspec and memorizz only: the package must start without an
event loop and without the daemon's dependencies (a test checks). The console
script is ``memorizz.cli:main``, which is this package's ``main``.
"""

from memorizz.ctl.run import main

__all__ = ["main"]
