"""OVERLORD benchmarks: ratios against a baseline measured in the same run.

    python3 bench/bench.py [--runs 60] [--json]

1. per-command: one command that writes one file inside an open session (launch, seal the
   layer, record provenance) vs util-linux `unshare -Urm sh -c 'mount -t overlay ...; exec true'`.
2. open + diff + rollback of a one-file change: a 100,000-file target vs a 10-file target.
   (and: a jailed command vs the same command unjailed, in open sessions)
3. commit of 10,000 new small files vs `cp -a` of the same files; and the same commit with
   its crash safety (journal, syncfs) and the objects it keeps vs a bare replay.
4. a command at stack depth 1, 100 and 400; fork and rewind at depth 400.

Figures and the machine they ran on are recorded in docs/PERFORMANCE.md.
"""
import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from overlord import ops  # noqa: E402
from overlord.sandbox import backends  # noqa: E402


def median_ms(samples):
    return statistics.median(samples) * 1000


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_per_command(tmp, runs, backend):
    target = os.path.join(tmp, "percmd")
    os.mkdir(target)
    sid = ops.run(["true"], target=target, backend=backend,
                  close_if_unchanged=False).sid   # an open session to exec in
    ours = [timed(lambda i=i: ops.exec_in(sid, ["touch", f"f{i}"])) for i in range(runs)]
    ops.rollback(sid)
    base = os.path.join(tmp, "unshare")
    lower = os.path.join(base, "lower")
    os.makedirs(lower)
    script = (f"mount -t overlay overlay -o lowerdir={lower},upperdir={base}/u,workdir={base}/w "
              f"{lower} && exec true")
    theirs = []
    for _ in range(runs):
        for d in ("u", "w"):
            shutil.rmtree(os.path.join(base, d), ignore_errors=True)
            os.mkdir(os.path.join(base, d))
        theirs.append(timed(lambda: subprocess.run(["unshare", "-Urm", "sh", "-c", script], check=True)))
    return {"overlord_ms": median_ms(ours), "baseline_ms": median_ms(theirs),
            "ratio": median_ms(ours) / median_ms(theirs), "target": 1.5, "runs": runs,
            "baseline": "unshare -Urm sh -c 'mount -t overlay ... && exec true'"}


def bench_jailed(tmp, runs, backend):
    """A jailed command in an open session against the same command unjailed (and, for the
    record, jailed and offline: --net none costs the kernel a network namespace per command)."""
    results = {}
    for name, grants in (("plain", {}), ("jailed", {"jail": True}),
                         ("offline", {"jail": True, "net": "none"})):
        target = os.path.join(tmp, f"jail-{name}")
        os.mkdir(target)
        sid = ops.run(["true"], target=target, backend=backend, grants=grants,
                      close_if_unchanged=False).sid
        results[name] = median_ms([timed(lambda i=i: ops.exec_in(sid, ["touch", f"f{i}"]))
                                   for i in range(runs)])
        ops.rollback(sid)
    return {"jailed_ms": results["jailed"], "unjailed_ms": results["plain"],
            "jailed_net_none_ms": results["offline"],
            "ratio": results["jailed"] / results["plain"], "target": 1.3, "runs": runs}


def bench_depth(tmp, runs, backend):
    """A command at stack depth 1, 100 and 400 (each sample adds a savepoint, as an agent's
    calls do; the stack is rewound to the depth after each series); rewind and fork at 400,
    and the first command after a rewind (which rebuilds the flattened lower layer)."""
    target = os.path.join(tmp, "depth")
    os.mkdir(target)
    sid = ops.run(["touch", "f0"], target=target, backend=backend).sid
    out, depth = {}, 1
    for want in (1, 100, 400):
        while depth < want:
            ops.exec_in(sid, ["touch", f"f{depth}"])
            depth += 1
        out[want] = median_ms([timed(lambda i=i: ops.exec_in(sid, ["touch", f"d{want}-{i}"]))
                               for i in range(runs)])
        ops.rewind(sid, depth - 1)
    ops.exec_in(sid, ["touch", "warm"])
    forked = {}
    fork_ms = timed(lambda: forked.setdefault("sid", ops.fork(sid, depth - 1))) * 1000
    rewind_ms = timed(lambda: ops.rewind(forked["sid"], 0)) * 1000     # drop 399 savepoints
    ops.rewind(sid, depth - 1)
    after_rewind_ms = timed(lambda: ops.exec_in(sid, ["touch", "after"])) * 1000
    return {"depth1_ms": out[1], "depth100_ms": out[100], "depth400_ms": out[400],
            "ratio": out[400] / out[1], "target": 1.3, "fork400_ms": fork_ms,
            "rewind400_ms": rewind_ms, "after_rewind_ms": after_rewind_ms, "runs": runs}


def make_tree(root, files, per_dir=1000):
    os.makedirs(root)
    for i in range(files):
        d = os.path.join(root, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.mkdir(d)
        with open(os.path.join(d, f"f{i:06d}.txt"), "w") as f:
            f.write(f"{i}\n")


def bench_open_diff_rollback(tmp, runs, backend):
    results = {}
    for n in (10, 100_000):
        target = os.path.join(tmp, f"tree{n}")
        make_tree(target, n, per_dir=min(n, 1000))

        def once():
            r = ops.run(["sh", "-c", "echo changed > d0000/f000000.txt"], target=target, backend=backend)
            assert len(ops.diff(r.sid)) == 1
            ops.rollback(r.sid)
        once()  # warm the page cache for both sizes alike
        results[n] = median_ms([timed(once) for _ in range(runs)])
    return {"small_ms": results[10], "large_ms": results[100_000],
            "ratio": results[100_000] / results[10], "target": 1.3, "runs": runs}


def bench_commit(tmp, backend, files=10_000):
    target = os.path.join(tmp, "committree")
    os.mkdir(target)
    script = ("i=0; while [ $i -lt %d ]; do d=d$((i / 1000)); mkdir -p $d; echo $i > $d/f$i.txt; "
              "i=$((i + 1)); done") % files
    sid = ops.run(["sh", "-c", script], target=target, backend=backend).sid
    layer = ops.get_session(sid).layer_dirs()[0]
    ours = timed(lambda: ops.commit(sid))
    assert len(os.listdir(os.path.join(target, "d0"))) == 1000
    dest = os.path.join(tmp, "cpdest")
    os.mkdir(dest)
    src = os.path.join(tmp, "cpsrc")
    shutil.copytree(target, src)
    theirs = timed(lambda: subprocess.run(["cp", "-a", src + "/.", dest], check=True))
    del layer
    return {"overlord_ms": ours * 1000, "baseline_ms": theirs * 1000, "ratio": ours / theirs,
            "target": 2.0, "files": files, "baseline": "cp -a"}


@contextlib.contextmanager
def bare_replay():
    """The engine's replay with its crash safety switched off: no journal written, no
    syncfs, no objects kept. Only for measuring what that safety costs."""
    from overlord.linux import libc
    from overlord.txn import replay
    saved = (replay.Journal.save, replay.Journal.finish, libc.syncfs, os.environ.get("OVERLORD_OBJECT_MAX"))
    replay.Journal.save = replay.Journal.finish = lambda self: None
    libc.syncfs = lambda path: None
    os.environ["OVERLORD_OBJECT_MAX"] = "0"
    try:
        yield
    finally:
        replay.Journal.save, replay.Journal.finish, libc.syncfs = saved[:3]
        os.environ.pop("OVERLORD_OBJECT_MAX")
        if saved[3] is not None:
            os.environ["OVERLORD_OBJECT_MAX"] = saved[3]


def bench_commit_journal(tmp, backend, files=10_000, rounds=3):
    """A 10k-file commit three ways: bare replay, with the journal (crash-atomic), and with
    the journal plus the objects blame and revert need (the default)."""
    script = ("i=0; while [ $i -lt %d ]; do d=d$((i / 1000)); mkdir -p $d; echo $i > $d/f$i.txt; "
              "i=$((i + 1)); done") % files
    modes = {"bare": bare_replay, "journal": lambda: _env("OVERLORD_OBJECT_MAX", "0"),
             "objects": contextlib.nullcontext}
    samples = {m: [] for m in modes}
    for r in range(rounds):
        for mode, ctx in modes.items():
            target = os.path.join(tmp, f"cj-{mode}-{r}")
            os.mkdir(target)
            sid = ops.run(["sh", "-c", script], target=target, backend=backend).sid
            os.sync()
            with ctx():
                samples[mode].append(timed(lambda: ops.commit(sid)))
    ms = {m: median_ms(v) for m, v in samples.items()}
    return {"bare_ms": ms["bare"], "journal_ms": ms["journal"], "objects_ms": ms["objects"],
            "ratio": ms["journal"] / ms["bare"], "ratio_objects": ms["objects"] / ms["bare"],
            "target": 1.2, "files": files, "rounds": rounds}


@contextlib.contextmanager
def _env(name, value):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name)
        if saved is not None:
            os.environ[name] = saved


def report(out):
    """One line per benchmark that ran."""
    lines = [f"{out['machine']} ({out['backend']} backend)"]
    pc, jl = out.get("per_command"), out.get("jailed")
    if pc:
        lines.append(f"per-command       {pc['overlord_ms']:8.2f} ms vs unshare+mount {pc['baseline_ms']:8.2f} ms"
                     f"  ratio {pc['ratio']:.2f} (target <= {pc['target']})")
    if jl:
        lines.append(f"jailed command    {jl['jailed_ms']:8.2f} ms vs unjailed {jl['unjailed_ms']:8.2f} ms"
                     f"  ratio {jl['ratio']:.2f} (target <= {jl['target']})")
        lines.append(f"jailed + net none {jl['jailed_net_none_ms']:8.2f} ms  (ratio to unjailed "
                     f"{jl['jailed_net_none_ms'] / jl['unjailed_ms']:.2f}; a network namespace per command)")
    od = out.get("open_diff_rollback")
    if od:
        lines.append(f"open+diff+rollback {od['large_ms']:7.2f} ms on 100k files vs {od['small_ms']:7.2f} ms on 10"
                     f"  ratio {od['ratio']:.2f} (target <= {od['target']})")
    cm = out.get("commit_10k")
    if cm:
        lines.append(f"commit 10k files  {cm['overlord_ms']:8.1f} ms vs cp -a {cm['baseline_ms']:8.1f} ms"
                     f"  ratio {cm['ratio']:.2f} (target <= {cm['target']})")
    cj = out.get("commit_journal")
    if cj:
        lines.append(f"commit journal    {cj['journal_ms']:8.1f} ms vs bare replay {cj['bare_ms']:8.1f} ms"
                     f"  ratio {cj['ratio']:.2f} (target <= {cj['target']}); with objects kept "
                     f"{cj['objects_ms']:.1f} ms, ratio {cj['ratio_objects']:.2f}")
    dp = out.get("depth")
    if dp:
        lines.append(f"stack depth       {dp['depth1_ms']:.2f} / {dp['depth100_ms']:.2f} / {dp['depth400_ms']:.2f} ms"
                     f" at 1 / 100 / 400  ratio 400:1 {dp['ratio']:.2f} (target <= {dp['target']}); "
                     f"fork at 400 {dp['fork400_ms']:.0f} ms, rewind 400 -> @0 {dp['rewind400_ms']:.0f} ms "
                     f"(targets < 200); first command after a rewind at 400 {dp['after_rewind_ms']:.0f} ms")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=60, help="samples per median (default 60)")
    p.add_argument("--backend", choices=("kernel", "fuse"), default="kernel")
    p.add_argument("--only", help="comma-separated benchmarks to run (default: all): "
                   "per_command, jailed, open_diff_rollback, commit_10k, commit_journal, depth")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="overlord-bench-")
    os.environ["OVERLORD_HOME"] = os.path.join(tmp, "home")
    backends.choose(args.backend)
    runs = args.runs
    benches = {
        "per_command": lambda: bench_per_command(tmp, runs, args.backend),
        "jailed": lambda: bench_jailed(tmp, runs, args.backend),
        "open_diff_rollback": lambda: bench_open_diff_rollback(tmp, max(10, runs // 4), args.backend),
        "commit_10k": lambda: bench_commit(tmp, args.backend),
        "commit_journal": lambda: bench_commit_journal(tmp, args.backend),
        "depth": lambda: bench_depth(tmp, max(10, runs // 3), args.backend),
    }
    chosen = args.only.split(",") if args.only else list(benches)
    unknown = [c for c in chosen if c not in benches]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}")
    out = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                      f"Linux {platform.release()}, Python {platform.python_version()}",
           "backend": args.backend}
    try:
        for name in chosen:
            out[name] = benches[name]()
    finally:
        subprocess.run(["rm", "-rf", tmp])
    print(json.dumps(out, indent=2) if args.json else report(out))


if __name__ == "__main__":
    main()
