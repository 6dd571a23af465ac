"""`overlord gc --dry-run` over 10,000 finished sessions (target: <= 5 s).

    python3 bench/bench_gc.py [--sessions 10000] [--runs 3] [--json]

One committed session is made for real through the CLI (a command that modifies one file and
adds two, then commit), so its record has the real shape: meta.json, provenance.jsonl,
committed.json, a pack with its index and a loose object for the replaced original. That
record is then copied N times under fresh session ids (the ids and times rewritten, the
object names made unique per copy so no two records share objects), with states spread
over committed / rolled-back / unchanged and close times spread over the last 60 days: about
half are past the 30-day default and the newest 10 committed are kept. Timed: the whole
`overlord gc --dry-run --json` process (interpreter start, recovery, plan, JSON out), best and
median of --runs, and its CPU time (user + system: what a busy machine's load does
not inflate). Figures: docs/PERFORMANCE.md.
"""
import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(home, *args):
    env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "overlord", *args], env=env, check=True,
                          capture_output=True, text=True)


def template(tmp):
    """A real committed session: (meta, provenance lines, committed.json, pack, idx)."""
    home, target = os.path.join(tmp, "seed"), os.path.join(tmp, "target")
    os.makedirs(target)
    with open(os.path.join(target, "a.txt"), "w") as f:
        f.write("one\n")
    out = cli(home, "run", "-t", target, "--", "sh", "-c",
              "echo two >> a.txt; echo new > b.txt; mkdir d; echo x > d/y").stdout
    sid = out.split()[1]
    cli(home, "commit", sid)
    sdir = os.path.join(home, "sessions", sid)
    read = lambda p: open(p, "rb").read()       # noqa: E731
    return (json.loads(read(os.path.join(sdir, "meta.json"))),
            read(os.path.join(sdir, "provenance.jsonl")).decode(),
            read(os.path.join(sdir, "committed.json")).decode(),
            read(os.path.join(home, "objects", "packs", f"{sid}.pack")),
            sid, target)


def populate(home, n, seed):
    meta0, prov0, comm0, pack0, sid0, target = seed
    shas = sorted({s for s in json.loads(comm0)["paths"] and
                   [v.get("sha") for st in json.loads(comm0)["paths"].values()
                    for v in (st["before"], st["after"]) if isinstance(v, dict)] if s})
    sessions = os.path.join(home, "sessions")
    packs = os.path.join(home, "objects", "packs")
    os.makedirs(sessions, mode=0o700)
    os.makedirs(packs, mode=0o700)
    rng = random.Random(16)
    now = time.time()
    base = int(now) - 61 * 86400
    states = ["committed"] * 6 + ["rolled-back"] * 3 + ["unchanged"]
    for i in range(n):
        created = base + i * (60 * 86400 // n)
        sid = time.strftime("%Y%m%d-%H%M%S", time.gmtime(created)) + f"-{i:06x}"
        state = rng.choice(states)
        new = {s: hashlib.sha256(f"{s}{i}".encode()).hexdigest() for s in shas}
        sub = lambda text: _sub(text, new)      # noqa: E731
        meta = json.loads(sub(json.dumps(meta0)))
        meta.update(sid=sid, created=created, finished=created + 1, state=state)
        for k in ("committed", "rolled_back"):
            meta.pop(k, None)
        d = os.path.join(sessions, sid)
        os.mkdir(d, 0o700)
        with open(os.path.join(d, "provenance.jsonl"), "w") as f:
            f.write(sub(prov0))
        if state == "committed":
            meta["committed"] = created + 2
            with open(os.path.join(d, "committed.json"), "w") as f:
                f.write(sub(comm0))
            idx = {s: [0, 1] for s in new.values()}
            with open(os.path.join(packs, f"{sid}.pack"), "wb") as f:
                f.write(pack0)
            with open(os.path.join(packs, f"{sid}.idx"), "w") as f:
                json.dump(idx, f)
            lo = sorted(new.values())[0]
            os.makedirs(os.path.join(home, "objects", lo[:2]), exist_ok=True)
            with open(os.path.join(home, "objects", lo[:2], lo[2:]), "wb") as f:
                f.write(b"one\n")
        elif state == "rolled-back":
            meta["rolled_back"] = created + 2
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f, sort_keys=True)
    os.makedirs(os.path.join(home, "locks"), exist_ok=True)


def _sub(text, new):
    for old, rep in new.items():
        text = text.replace(old, rep)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-gc-")
    try:
        seed = template(tmp)
        home = os.path.join(tmp, "home")
        t0 = time.perf_counter()
        populate(home, a.sessions, seed)
        made = time.perf_counter() - t0
        times, cpu, report = [], [], None
        for _ in range(a.runs):
            t = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            report = json.loads(cli(home, "gc", "--dry-run", "--json").stdout)
            times.append(time.perf_counter() - t)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        result = {"sessions": a.sessions, "made_s": round(made, 2),
                  "dry_run_best_s": round(min(times), 3),
                  "dry_run_median_s": round(statistics.median(times), 3),
                  "dry_run_cpu_median_s": round(statistics.median(cpu), 3),
                  "load_average": os.getloadavg()[0],
                  "would_remove": report["counts"], "bytes": report["bytes"]["total"],
                  "kept": report["kept"], "target_s": 5.0,
                  "ok": statistics.median(times) <= 5.0}
        if a.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"gc --dry-run over {a.sessions} finished sessions: median "
                  f"{result['dry_run_median_s']} s, best {result['dry_run_best_s']} s, "
                  f"cpu {result['dry_run_cpu_median_s']} s (load {result['load_average']:.1f}; "
                  f"target <= 5 s: {'ok' if result['ok'] else 'OVER'})")
            print(f"  would remove {report['counts']['sessions']} sessions, "
                  f"{report['counts']['objects']} objects, {report['counts']['packs']} packs "
                  f"({report['bytes']['total']} bytes); kept {report['kept']}")
        return 0 if result["ok"] else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
