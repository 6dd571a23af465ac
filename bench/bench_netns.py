"""OVERLORD benchmarks, issue 17: the per-session network namespace (sandbox/netns.py).

    python3 bench/bench_netns.py [--runs 60] [--json]

1. per command, in open sessions (ops.exec_in repeated in one process, samples interleaved
   round-robin so drift hits every series alike): a jailed `--net none` command, a jailed
   `--net proxy` command, and -- for the record -- a jailed command on the host's network and
   a jailed `--net none` command that builds a network namespace of its own (the path before
   issue 17), each against the same command unjailed. Targets: none <= 1.3x, proxy <= 1.5x.
2. a fresh session's first command (ops.run, which opens the session and starts its holder,
   and for proxy its back): none and proxy against the same run unjailed.

Figures and the machine they ran on are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from overlord import ops  # noqa: E402
from overlord.sandbox import backends, netns  # noqa: E402

SERIES = {"unjailed": {}, "jailed": {"jail": True},
          "none": {"jail": True, "net": "none"},
          "proxy": {"jail": True, "net": "proxy"},
          "none_own_netns": {"jail": True, "net": "none"}}


def median_ms(samples):
    return statistics.median(samples) * 1000


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class own_netns:
    """The path before issue 17: no holder, so the kernel backend gives the command a fresh
    network namespace of its own (kernel.namespaces: CLONE_NEWNET)."""

    def __enter__(self):
        self.real = netns.ensure
        netns.ensure = lambda *a, **kw: None

    def __exit__(self, *exc):
        netns.ensure = self.real


def bench_per_command(tmp, runs):
    sids, samples = {}, {name: [] for name in SERIES}
    for name, grants in SERIES.items():
        target = os.path.join(tmp, f"cmd-{name}")
        os.mkdir(target)
        sids[name] = ops.run(["true"], target=target, backend="kernel", grants=grants,
                             close_if_unchanged=False).sid
    for name in SERIES:                          # warm each path once
        _exec(name, sids[name], "warm")
    for i in range(runs):
        for name in SERIES:
            samples[name].append(timed(lambda: _exec(name, sids[name], f"f{i}")))
    for sid in sids.values():
        ops.rollback(sid)
    ms = {name: median_ms(s) for name, s in samples.items()}
    base = ms["unjailed"]
    return {"unjailed_ms": base, "jailed_ms": ms["jailed"], "net_none_ms": ms["none"],
            "net_proxy_ms": ms["proxy"], "net_none_own_netns_ms": ms["none_own_netns"],
            "none_ratio": ms["none"] / base, "none_target": 1.3,
            "proxy_ratio": ms["proxy"] / base, "proxy_target": 1.5,
            "jailed_ratio": ms["jailed"] / base,
            "own_netns_ratio": ms["none_own_netns"] / base, "runs": runs}


def _exec(name, sid, fname):
    if name == "none_own_netns":
        with own_netns():
            ops.exec_in(sid, ["touch", fname])
    else:
        ops.exec_in(sid, ["touch", fname])


def bench_first_command(tmp, runs):
    """ops.run of `touch f` in a fresh session (opened, run, left pending, rolled back
    untimed): the holder's start is in the none/proxy figures."""
    samples = {name: [] for name in ("unjailed", "jailed", "none", "proxy")}
    for i in range(runs):
        for name in samples:
            target = os.path.join(tmp, f"first-{name}-{i}")
            os.mkdir(target)
            t = time.perf_counter()
            sid = ops.run(["touch", "f"], target=target, backend="kernel",
                          grants=SERIES[name]).sid
            samples[name].append(time.perf_counter() - t)
            ops.rollback(sid)
    ms = {name: median_ms(s) for name, s in samples.items()}
    return {"unjailed_ms": ms["unjailed"], "jailed_ms": ms["jailed"], "net_none_ms": ms["none"],
            "net_proxy_ms": ms["proxy"], "none_ratio": ms["none"] / ms["unjailed"],
            "proxy_ratio": ms["proxy"] / ms["unjailed"],
            "holder_start_ms": ms["none"] - ms["jailed"],
            "holder_and_proxy_start_ms": ms["proxy"] - ms["jailed"], "runs": runs}


def report(out):
    lines = [f"machine: {out['machine']}"]
    c = out.get("per_command")
    if c:
        lines += [
            f"per command (median of {c['runs']}, interleaved):",
            f"  unjailed                         {c['unjailed_ms']:.2f} ms",
            f"  jailed, host network             {c['jailed_ms']:.2f} ms  ({c['jailed_ratio']:.2f}x)",
            f"  jailed --net none (session netns) {c['net_none_ms']:.2f} ms  ({c['none_ratio']:.2f}x, "
            f"target <= {c['none_target']}x)",
            f"  jailed --net proxy               {c['net_proxy_ms']:.2f} ms  ({c['proxy_ratio']:.2f}x, "
            f"target <= {c['proxy_target']}x)",
            f"  jailed --net none, own netns (before) {c['net_none_own_netns_ms']:.2f} ms  "
            f"({c['own_netns_ratio']:.2f}x)"]
    f = out.get("first_command")
    if f:
        lines += [
            f"a fresh session's first command (ops.run, median of {f['runs']}):",
            f"  unjailed {f['unjailed_ms']:.2f} ms, jailed {f['jailed_ms']:.2f} ms, "
            f"--net none {f['net_none_ms']:.2f} ms ({f['none_ratio']:.2f}x), "
            f"--net proxy {f['net_proxy_ms']:.2f} ms ({f['proxy_ratio']:.2f}x)",
            f"  holder start ~{f['holder_start_ms']:.2f} ms, holder + proxy start "
            f"~{f['holder_and_proxy_start_ms']:.2f} ms (over a jailed host-network run)"]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=60, help="samples per median (default 60)")
    p.add_argument("--only", help="comma-separated: per_command, first_command (default: both)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="overlord-bench-netns-")
    os.environ["OVERLORD_HOME"] = os.path.join(tmp, "home")
    backends.choose("kernel")
    benches = {"per_command": lambda: bench_per_command(tmp, args.runs),
               "first_command": lambda: bench_first_command(tmp, max(10, args.runs // 3))}
    chosen = args.only.split(",") if args.only else list(benches)
    unknown = [c for c in chosen if c not in benches]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}")
    out = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                      f"Linux {platform.release()}, Python {platform.python_version()}, "
                      f"uid {os.getuid()}"}
    try:
        for name in chosen:
            out[name] = benches[name]()
    finally:
        netns.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2) if args.json else report(out))


if __name__ == "__main__":
    main()
