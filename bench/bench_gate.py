"""The content gate's cost: gate.scan() over a 1,000-file change of ~4 KiB source files.

    python3 bench/bench_gate.py [--files 1000] [--runs 15] [--json]

Prints the median ms of scan() with the default checks over the files as added, the same
files as modified (the real tree holds an older version of each), and, as the floor any scan
pays, one open + read + close of every file. The commit budget (commit with policy and the
gate <= 1.2x the same commit without them) is measured by the lead's bench/bench_trust.py;
this isolates the gate's share of it. Figures go to docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from overlord.trust import gate  # noqa: E402
from overlord.txn import changes as C  # noqa: E402
from overlord.txn import layers as L  # noqa: E402

# Source-like lines, with the words that make the gate look closer (key, token, pass, sk-).
LINES = (
    "def handle_request(request, session_key=None):",
    "    token = request.headers.get('Authorization', '')",
    "    if not token:",
    "        raise PermissionError('missing token for the task-runner')",
    "    cache_key = f'user:{request.user.id}:profile'",
    "    password_field = forms.CharField(widget=forms.PasswordInput)",
    "    for key, value in sorted(payload.items()):",
    "        out[key] = normalize(value)  # keep the order stable",
    "    return JsonResponse({'status': 'ok', 'count': len(out)})",
    "",
    "class Settings:",
    "    SECRET_KEY = os.environ['SECRET_KEY']",
    "    DATABASE_URL = 'postgres://localhost/app'",
    "    passes = 3  # bypass the disk-cache on the first pass",
    "# risk-based scoring: see docs/scoring.md for the weights and their sources",
)


def make_files(root, n, seed, size=4096):
    rnd = random.Random(seed)
    paths = []
    for i in range(n):
        d = os.path.join(root, f"pkg{i // 100:02d}")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"mod{i:04d}.py")
        lines, total = [], 0
        while total < size:
            line = rnd.choice(LINES) + f"  # {rnd.randrange(10**6)}"
            lines.append(line)
            total += len(line) + 1
        with open(p, "w") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(os.path.relpath(p, root))
    return paths


def plan_of(layer, target, rels, kind):
    out = []
    for rel in rels:
        src = os.path.join(layer, rel)
        entry = L.Entry(rel, "file", src, os.lstat(src), layer=0, xattrs={}, forged=[])
        real = os.lstat(os.path.join(target, rel)) if kind == "modified" else None
        out.append(C.Change(rel, kind, entry, real, {}, False if kind == "modified" else None))
    return out


def median_ms(fn, runs):
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def read_all(plan):
    for ch in plan:
        fd = os.open(ch.entry.src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.read(fd, ch.entry.st.st_size)
        os.close(fd)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        layer, target = os.path.join(tmp, "layer"), os.path.join(tmp, "target")
        rels = make_files(layer, args.files, 1)
        make_files(target, args.files, 2)
        added = plan_of(layer, target, rels, "added")
        modified = plan_of(layer, target, rels, "modified")
        nbytes = sum(ch.entry.st.st_size for ch in added)
        assert not [f for f in gate.scan(target, added, {}) if f.kind == "secrets"]
        out = {
            "files": args.files, "bytes": nbytes,
            "scan_added_ms": median_ms(lambda: gate.scan(target, added, {}), args.runs),
            "scan_modified_ms": median_ms(lambda: gate.scan(target, modified, {}), args.runs),
            "read_only_ms": median_ms(lambda: read_all(added), args.runs),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, Linux {platform.release()}, "
                       f"Python {platform.python_version()}",
        }
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    print(f"gate scan, {out['files']} files ({out['bytes'] / 1024:.0f} KiB): "
          f"added {out['scan_added_ms']:.1f} ms, modified {out['scan_modified_ms']:.1f} ms; "
          f"open+read+close alone {out['read_only_ms']:.1f} ms  ({out['machine']})")


if __name__ == "__main__":
    main()
