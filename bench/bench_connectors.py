"""A connector call's cost: what the gate and the record add to an MCP tool call.

    python3 bench/bench_connectors.py [--runs 200] [--json]

server-everything's `echo` (read-only: it passes the gate without asking) on stdio, called
through ops.connectors.Hands -- fingerprint, connector.call / .decision / .result on the audit
chain (each an fsync'd append), the approval and tool events in the transcript, the result's
hash -- against the client's bare call_tool on the same connection. Also the server's start
(spawn, the stateless attempt, the handshake, tools/list). Median of --runs each, interleaved.
Needs `npm ci --prefix test/connectors/servers`. Figures are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import median_ms, timed  # noqa: E402
from bench_mcp import folder, fresh_home  # noqa: E402
from overlord import ops  # noqa: E402
from overlord.agent import transcript as T  # noqa: E402
from overlord.agent.connectors import client as mcp_client  # noqa: E402
from overlord.ops import connectors as hands_ops  # noqa: E402

SERVER = os.path.join(REPO, "test", "connectors", "servers", "node_modules", ".bin", "mcp-server-everything")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not os.path.exists(SERVER):
        sys.exit(f"bench_connectors: {SERVER} is missing (npm ci --prefix test/connectors/servers)")
    tmp, home = fresh_home("ovl-bench-conn-")
    try:
        with open(os.path.join(home, "mcp.json"), "w") as f:
            json.dump({"approval": "ask", "servers": {"everything": {"command": SERVER, "args": ["stdio"]}}}, f)
        os.chmod(os.path.join(home, "mcp.json"), 0o600)
        target = folder(tmp, "target")
        sid = ops.run(["true"], target=target, backend="fuse", grants={"jail": False, "net": "host"},
                      close_if_unchanged=False).sid
        session = ops.get_session(sid)
        record = T.Transcript(session.dir)
        cancel = ops.Cancel()
        starts = []
        for _ in range(5):
            t = time.perf_counter()
            hands = hands_ops.Hands(session, {"names": ["everything"], "shell": False}, record, None, cancel)
            hands.start()
            starts.append(time.perf_counter() - t)
            hands.close()
        hands = hands_ops.Hands(session, {"names": ["everything"], "shell": False}, record, None, cancel)
        hands.start()
        bare_client = mcp_client.open(hands.servers["everything"], cancel=cancel)
        gated, bare = [], []
        for i in range(args.runs):
            msg = {"message": f"hello {i}"}
            gated.append(timed(lambda: hands.call("mcp__everything__echo", msg, 1, f"c{i}")))
            bare.append(timed(lambda: bare_client.call_tool("echo", msg)))
        hands.close()
        bare_client.close()
        ops.rollback(sid)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"runs": args.runs, "start_ms": round(median_ms(starts), 1),
           "bare_call_ms": round(median_ms(bare), 2), "gated_call_ms": round(median_ms(gated), 2)}
    out["added_ms"] = round(out["gated_call_ms"] - out["bare_call_ms"], 2)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"server start (spawn, discover, handshake, tools/list): {out['start_ms']} ms")
        print(f"echo, bare client call_tool:                          {out['bare_call_ms']} ms")
        print(f"echo, through the hands (gate, 3 audit acts, record): {out['gated_call_ms']} ms "
              f"(+{out['added_ms']} ms)")


if __name__ == "__main__":
    main()
