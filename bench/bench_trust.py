"""Commit under policy and the content gate vs the same commit without them.

    python3 bench/bench_trust.py [--files 1000] [--rounds 5] [--backend kernel|fuse] [--json]

A session writes --files new files of ~4 KiB of source-like text (one in ten a dependency
manifest name, so the gate has findings to report at `warn`); it is committed twice over,
round after round: once with every check `off` and no other rule (the gate scans nothing), once
under a policy with protected globs that match nothing, `require_review` off and the default
checks (secrets countersign, binaries warn, dependencies warn, size warn) -- the gate reads every
file. The ratio is the median of the second over the first. The issue asks for <= 1.2x.
Figures are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from overlord import ops  # noqa: E402

OFF = {"default": {"checks": {"secrets": "off", "binaries": "off", "dependencies": "off"}}}
ON = {"default": {"protect": ["deploy/**", "*.pem", ".github/**"]}}
LINE = "def handler_{i}(request):\n    return render(request, 'page_{i}.html', {{'n': {i}}})\n"


def write_files(root, files):
    for i in range(files):
        d = os.path.join(root, f"pkg{i // 100}")
        os.makedirs(d, exist_ok=True)
        name = "requirements.txt" if i % 10 == 0 else f"mod{i}.py"
        with open(os.path.join(d, name), "w") as f:
            f.write("".join(LINE.format(i=i * 50 + j) for j in range(40)))


def one_commit(tmp, backend, files, policy, n):
    home = os.environ["OVERLORD_HOME"]
    with open(os.path.join(home, "policy.json"), "w") as f:
        json.dump(policy, f)
    target = os.path.join(tmp, f"t{n}")
    os.mkdir(target)
    stage = os.path.join(tmp, f"stage{n}")
    write_files(stage, files)
    sid = ops.run(["cp", "-a", stage + "/.", target], target=target, backend=backend).sid
    t = time.perf_counter()
    ops.commit(sid)
    took = time.perf_counter() - t
    shutil.rmtree(target)
    shutil.rmtree(stage)
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ovl-bench-trust-")
    os.environ["OVERLORD_HOME"] = os.path.join(tmp, "home")
    os.mkdir(os.environ["OVERLORD_HOME"], 0o700)
    try:
        off, on = [], []
        for r in range(args.rounds):         # interleaved: drift of the machine hits both alike
            off.append(one_commit(tmp, args.backend, args.files, OFF, 2 * r))
            on.append(one_commit(tmp, args.backend, args.files, ON, 2 * r + 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"files": args.files, "rounds": args.rounds,
           "without_ms": statistics.median(off) * 1000, "with_ms": statistics.median(on) * 1000}
    out["ratio"] = out["with_ms"] / out["without_ms"]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"commit of {args.files} files: {out['with_ms']:.1f} ms with policy + gate vs "
              f"{out['without_ms']:.1f} ms without ({out['ratio']:.2f}x; target <= 1.2x)")


if __name__ == "__main__":
    main()
