"""Start-up of `overlord mcp serve`: claim the transport, fork the launcher, serve.

The server is threaded (a tool call runs on a thread of its own), and a threaded process must
never clone namespaces: the launcher helper is forked first, while the process is still
single-threaded, and every command of every session travels through it.
"""
import signal
import sys

from overlord.text import escape_path


def serve(target, bind=None):
    """Serve MCP for the project at target: on stdio, or on bind ('127.0.0.1:PORT')."""
    from overlord.mcp import http, stdio, tools
    from overlord.ops import launcher
    if bind is not None:
        host, port = http.parse_bind(bind)
    else:
        infile, out_fd = stdio.claim_stdio()
    table = tools.Table(target)               # loads the broker before the helper forks

    def stop(signum, frame):
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, stop)
    with launcher.serving():
        if bind is not None:
            try:
                return http.serve(table, host, port)
            except KeyboardInterrupt:
                return 0
        print(f"overlord mcp: serving on stdio, project {escape_path(target)}", file=sys.stderr,
              flush=True)
        return stdio.serve(table, infile, out_fd)
