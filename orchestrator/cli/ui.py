"""`servesweep ui`: the local web page."""

from __future__ import annotations

import sys

from orchestrator.fields import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("ui", help="a local web page: build commands, run estimates and searches, explore results")
    p.add_argument("--results", help="a results directory or URI to open in the Explore tab")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; every call needs "
                   "the token in the printed URL: listen elsewhere only on a network you trust)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.set_defaults(func=cmd_ui)


def cmd_ui(a) -> int:
    from orchestrator.ui import LOOPBACK, serve

    if not 0 <= a.port <= 65535:
        raise InputError("--port", a.port, "an integer in [0, 65535]")
    if a.host not in LOOPBACK:
        print(f"servesweep ui: warning: listening on {a.host}: anyone who reaches it with the token can run "
              "searches on this machine", file=sys.stderr)
    try:
        server = serve(a.host, a.port, a.results)
    except OSError as err:
        raise InputError("--port", a.port, f"a free port on {a.host} ({err.strerror or err})") from None
    print(f"servesweep ui: {server.url} (Ctrl-C stops it)", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


#: what `plan` deploys unless told otherwise: the commands it prints are vLLM's
