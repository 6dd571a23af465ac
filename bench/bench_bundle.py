"""Bundles: export + import of a 1,000-file pending session vs `tar czf` + `tar xzf` of the
same files (issue 16: ≤ 2×).

    python3 bench/bench_bundle.py [--files 1000] [--size 2048] [--runs 5] [--json]

Ours, per run: `ops.export_session` (plan, hash every member, manifest + HMAC, gzip -6) on
machine a, then `ops.import_bundle` on a fresh OVERLORD_HOME b (stream-verify every member,
stage, land the record with its changes). Baseline: `tar czf` of the session's 1,000 files
and `tar xzf` of it into a fresh directory. Also shown, not part of the ratio: `import -t`,
which additionally opens a session on a folder and replays the changes through the sandbox.
Medians of --runs. Figures are recorded in docs/PERFORMANCE.md.
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


@contextlib.contextmanager
def home(path):
    old = os.environ.get("OVERLORD_HOME")
    os.environ["OVERLORD_HOME"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OVERLORD_HOME", None)
        else:
            os.environ["OVERLORD_HOME"] = old


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def make_session(tmp, files, size):
    """A pending session that wrote `files` files of `size` bytes (text-like content, so
    gzip has real work) in 20 directories."""
    target = os.path.join(tmp, "target")
    os.mkdir(target)
    script = (
        "import os, random, sys\n"
        "n, size = int(sys.argv[1]), int(sys.argv[2])\n"
        "rnd = random.Random(7)\n"
        "words = [''.join(rnd.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rnd.randint(2, 9)))"
        " for _ in range(500)]\n"
        "for i in range(n):\n"
        "    d = f'd{i % 20:02d}'\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    text = []\n"
        "    while sum(map(len, text)) < size:\n"
        "        text.append(rnd.choice(words) + (' ' if rnd.random() < 0.9 else '\\n'))\n"
        "    with open(f'{d}/f{i:04d}.txt', 'w') as f:\n"
        "        f.write(''.join(text)[:size])\n")
    res = ops.run([sys.executable, "-c", script, str(files), str(size)], target=target)
    assert res.state == "pending", res
    return res.sid, target, ops.get_session(res.sid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-bundle-")
    try:
        a = os.path.join(tmp, "a")
        os.mkdir(a)
        with home(a):
            sid, target, session = make_session(tmp, args.files, args.size)
            upper = session.layer_dirs()[0]     # the session's files, as tar would take them
        ours_export, ours_import, replay, tar_c, tar_x, sizes = [], [], [], [], [], {}
        for run in range(args.runs):
            out = os.path.join(tmp, f"s{run}.ovl")
            with home(a):
                ours_export.append(timed(lambda: ops.export_session(sid, out)))
            b = os.path.join(tmp, f"b{run}")
            os.mkdir(b)
            with home(b):
                ours_import.append(timed(lambda: ops.import_bundle(out)))
            c = os.path.join(tmp, f"c{run}")
            os.mkdir(c)
            dest = os.path.join(tmp, f"replay{run}")
            os.mkdir(dest)
            with home(c):
                replay.append(timed(lambda: ops.import_bundle(out, target=dest)))
            tgz = os.path.join(tmp, f"t{run}.tgz")
            tar_c.append(timed(lambda: subprocess.run(
                ["tar", "czf", tgz, "--exclude=./.wh*", "-C", upper, "."], check=True)))
            x = os.path.join(tmp, f"x{run}")
            os.mkdir(x)
            tar_x.append(timed(lambda: subprocess.run(["tar", "xzf", tgz, "-C", x], check=True)))
            sizes = {"ovl_bytes": os.path.getsize(out), "tgz_bytes": os.path.getsize(tgz)}
        med = lambda xs: statistics.median(xs) * 1000          # noqa: E731
        ours = med([e + i for e, i in zip(ours_export, ours_import)])
        theirs = med([c + x for c, x in zip(tar_c, tar_x)])
        report = {"files": args.files, "size": args.size, "runs": args.runs,
                  "export_ms": round(med(ours_export), 1), "import_ms": round(med(ours_import), 1),
                  "export_import_ms": round(ours, 1),
                  "tar_czf_ms": round(med(tar_c), 1), "tar_xzf_ms": round(med(tar_x), 1),
                  "tar_ms": round(theirs, 1), "ratio": round(ours / theirs, 2),
                  "target_ratio": 2.0, "import_replay_ms": round(med(replay), 1),
                  "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                             f"Python {platform.python_version()}", **sizes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["ratio"] <= 2.0 else 1
    print(f"bundle export + import of a {args.files}-file pending session ({args.size} B files), "
          f"median of {args.runs}:")
    print(f"  ours      export {report['export_ms']:.1f} ms + import {report['import_ms']:.1f} ms "
          f"= {report['export_import_ms']:.1f} ms  ({sizes['ovl_bytes']:,} bytes)")
    print(f"  tar       czf {report['tar_czf_ms']:.1f} ms + xzf {report['tar_xzf_ms']:.1f} ms "
          f"= {report['tar_ms']:.1f} ms  ({sizes['tgz_bytes']:,} bytes)")
    print(f"  ratio     {report['ratio']:.2f}x  (target <= 2x)")
    print(f"  import -t (record + replay as a new pending session): {report['import_replay_ms']:.1f} ms")
    return 0 if report["ratio"] <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
