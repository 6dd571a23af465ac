"""The MCP server through the official SDK: one `exec` tool call's cost.

    python3 bench/bench_mcp.py [--runs 60] [--backend kernel|fuse] [--mode auto|legacy] [--json]

`exec` of `true` in an open session through `overlord mcp serve` on stdio -- the official
`mcp` SDK's call_tool to its result: JSON-RPC line -> the server's reader -> a call thread ->
ops.Broker (policy, output capture) -> the launcher's worker -> ops.exec_in -- against
`ops.exec_in` of the same command made in this process (no server, no launcher, no capture),
both in sessions with the brokered grants (jailed and offline on the kernel backend). The
tool runs its command as `bash -c COMMAND`, so the in-process baseline runs `bash -c true`
too (`true` alone is reported beside it). Median of --runs each, interleaved in rounds, the
in-process samples taken while this process has no other thread (the SDK's stdio transport
keeps one while it is connected), as the engine requires of a process that clones. The issue
asks for <= 1.5x. Needs the `mcp` package (pip install mcp==2.3.0). Figures are recorded in
docs/PERFORMANCE.md.
"""
import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import median_ms, timed  # noqa: E402,F401 - bench_daemon takes them from here too
from overlord import ops  # noqa: E402


def brokered_grants(backend):
    """What a brokered session gets unasked (jailed, offline); the fuse backend has no jail."""
    return {"jail": False, "net": "host"} if backend == "fuse" else {"jail": True, "net": "none"}


def fresh_home(prefix):
    """(tmp, home): a fresh temporary folder, and OVERLORD_HOME (set for this process) in it."""
    tmp = os.path.realpath(tempfile.mkdtemp(prefix=prefix))
    home = os.path.join(tmp, "home")
    os.mkdir(home, 0o700)
    os.environ["OVERLORD_HOME"] = home
    return tmp, home


def folder(tmp, name):
    path = os.path.join(tmp, name)
    os.mkdir(path)
    return path


def install_policy(tmp, backend):
    path = os.path.join(tmp, "policy.json")
    with open(path, "w") as f:
        json.dump({"targets": {tmp: {"net": "host"} if backend == "fuse" else {}}}, f)
    ops.policy_set(path)


async def mcp_round(target, backend, mode, per, log):
    """Connect the SDK to a fresh `overlord mcp serve`, open a session, time per exec calls
    of `true` (after one untimed call); returns (samples, tools/list round trips, version)."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp_types import Implementation
    env = dict(os.environ, PYTHONPATH=REPO)
    if backend:
        env["OVERLORD_TEST_BACKEND"] = backend
    params = StdioServerParameters(command=sys.executable, cwd=REPO, env=env,
                                   args=["-m", "overlord", "mcp", "serve", "-t", target])
    grants = {"jail": False, "net": "host"} if backend == "fuse" else {}
    async with Client(stdio_client(params, errlog=log), mode=mode, read_timeout_seconds=60,
                      client_info=Implementation(name="bench", version="1")) as client:
        opened = await client.call_tool("open_session", dict(grants, stack=True))
        if opened.is_error:
            raise SystemExit(f"open_session refused: {opened.content[0].text}")
        sid = opened.structured_content["session"]
        args = {"session": sid, "command": "true"}
        await client.call_tool("exec", args)
        samples, listed = [], []
        for _ in range(per):
            t = time.perf_counter()
            result = await client.call_tool("exec", args)
            samples.append(time.perf_counter() - t)
            if result.is_error or result.structured_content["exit_code"] != 0:
                raise SystemExit(f"exec failed: {result.content[0].text}")
            t = time.perf_counter()
            await client.list_tools(cache_mode="bypass")
            listed.append(time.perf_counter() - t)
        await client.call_tool("rollback", {"session": sid})
        return samples, listed, client.protocol_version


def alone(deadline=10.0):
    """Wait until this process has no thread but its own (the SDK's watcher ends with the
    server's exit)."""
    end = time.monotonic() + deadline
    while threading.active_count() > 1:
        if time.monotonic() > end:
            raise SystemExit(f"threads still running: {threading.enumerate()}")
        time.sleep(0.01)


def bench_exec(tmp, runs, backend, mode, rounds=6):
    grants = brokered_grants(backend)
    local = ops.run(["true"], target=folder(tmp, "local"), backend=backend, grants=grants,
                    close_if_unchanged=False).sid
    remote = folder(tmp, "remote")
    per = max(1, runs // rounds)
    ours, listed, bash, bare = [], [], [], []
    version = None
    with open(os.path.join(tmp, "server.log"), "w") as log:
        for _ in range(rounds):
            alone()
            bash += [timed(lambda: ops.exec_in(local, ["bash", "-c", "true"])) for _ in range(per)]
            bare += [timed(lambda: ops.exec_in(local, ["true"])) for _ in range(per)]
            got, lists, version = asyncio.run(mcp_round(remote, backend, mode, per, log))
            ours += got
            listed += lists
    ops.rollback(local)
    return {"mcp_ms": median_ms(ours), "in_process_ms": median_ms(bash),
            "in_process_bare_true_ms": median_ms(bare), "tools_list_ms": median_ms(listed),
            "ratio": median_ms(ours) / median_ms(bash), "target": 1.5, "runs": len(ours),
            "grants": grants, "protocol_version": version, "mode": mode}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--mode", default="auto", choices=("auto", "legacy"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp, _ = fresh_home("ovl-bench-mcp-")
    try:
        install_policy(tmp, args.backend)
        out = {"exec": bench_exec(tmp, args.runs, args.backend, args.mode)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    e = out["exec"]
    print(f"exec of `true` through overlord mcp serve (stdio, SDK call_tool to result, "
          f"{e['protocol_version']}): {e['mcp_ms']:.2f} ms vs {e['in_process_ms']:.2f} ms "
          f"ops.exec_in of `bash -c true` in process ({e['ratio']:.2f}x; target <= 1.5x; median "
          f"of {e['runs']}, grants {e['grants']})")
    print(f"  for reference: ops.exec_in of bare `true` {e['in_process_bare_true_ms']:.2f} ms; "
          f"a tools/list round trip {e['tools_list_ms']:.2f} ms")


if __name__ == "__main__":
    main()
