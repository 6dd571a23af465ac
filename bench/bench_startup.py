"""The CLI's own start-up, which a harness hook pays on every call: whole processes against
`python3 -c pass` started the same way, in the same run.

    python3 bench/bench_startup.py [--runs 40] [--python PATH] [--backend kernel|fuse] [--json]

1. `overlord --help`                                        target <= 1.3x
2. `overlord exec SID -- true` in a pending session          target <= 1.6x
3. `overlord hook claude-code` answering a Bash payload (its session reused)   target <= 1.5x

Every process is `PYTHON -m overlord ...` (PYTHONPATH is the checkout) with a private
OVERLORD_HOME; the four commands are timed in turn in each round (medians of --runs rounds), so
a machine that slows down mid-run slows all of them alike. Beside the wall time, the CPU time
the process and all it waited for spent (less swayed by other work on a shared machine).
--python times another interpreter
(e.g. /usr/bin/python3, whose site imports less than a virtualenv's). Figures go in
docs/PERFORMANCE.md with the machine they ran on.
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"help": 1.3, "exec": 1.6, "hook": 1.5}


def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv, env, stdin=None):
    """(wall seconds, CPU seconds of the process and everything it waited for, the process)."""
    c, t = cpu(), time.perf_counter()
    proc = subprocess.run(argv, env=env, input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    return time.perf_counter() - t, cpu() - c, proc


def checked(argv, env, stdin=None):
    proc = timed(argv, env, stdin)[2]
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[2:])} failed ({proc.returncode}): "
                         f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def setup(tmp, python, backend):
    """A home with a policy admitting the target (the hook's session is brokered), a pending
    session to exec in, and the hook's own session opened once (every timed call reuses it)."""
    home, target = os.path.join(tmp, "home"), os.path.join(tmp, "project")
    os.makedirs(target)
    os.makedirs(home, mode=0o700)
    rule = {"jail": backend == "kernel"} | ({} if backend == "kernel" else {"net": "host"})
    policy = os.path.join(home, "policy.json")
    with open(os.open(policy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump({"targets": {target: rule}}, f)
    env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO, OVERLORD_TEST_BACKEND=backend,
               PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))   # warm: bytecode kept, as installed
    for name in ("PYTHONDONTWRITEBYTECODE", "CLAUDE_PROJECT_DIR"):
        env.pop(name, None)
    ovl = [python, "-m", "overlord"]
    out = checked([*ovl, "run", "-t", target, "--json", "--", "sh", "-c", "echo x > seed"], env)
    sid = json.loads(out.strip().splitlines()[-1])["sid"]
    payload = json.dumps({"session_id": "bench", "transcript_path": os.path.join(tmp, "t.jsonl"),
                          "cwd": target, "hook_event_name": "PreToolUse", "tool_name": "Bash",
                          "tool_input": {"command": "ls", "description": "list"}}).encode()
    hook_sid = None
    if "hook" in checked([*ovl, "--help"], env).split():
        checked([*ovl, "rollback", sid], env)      # the hook opens its own session on the target
        checked([*ovl, "hook", "claude-code"], env, payload)
        hook_sid = next(m["sid"] for m in json.loads(checked([*ovl, "sessions", "--json"], env))
                        if m["state"] == "pending")
        out = checked([*ovl, "run", "-t", target, "--stack", "--json", "--",
                       "sh", "-c", "echo x > seed"], env)
        sid = json.loads(out.strip().splitlines()[-1])["sid"]
    return env, ovl, sid, payload, hook_sid


def bench(python, runs, backend):
    tmp = tempfile.mkdtemp(prefix="overlord-bench-startup-")
    try:
        env, ovl, sid, payload, hook_sid = setup(tmp, python, backend)
        cases = {"baseline": ([python, "-c", "pass"], None),
                 "help": ([*ovl, "--help"], None),
                 "exec": ([*ovl, "exec", sid, "--", "true"], None)}
        if hook_sid:
            cases["hook"] = ([*ovl, "hook", "claude-code"], payload)
        wall = {name: [] for name in cases}
        spent = {name: [] for name in cases}
        for name, (argv, stdin) in cases.items():          # warm the caches
            timed(argv, env, stdin)
        for _ in range(runs):
            for name, (argv, stdin) in cases.items():
                elapsed, used, proc = timed(argv, env, stdin)
                if proc.returncode != 0:
                    raise SystemExit(f"bench: {name} failed: {proc.stderr.decode(errors='replace')}")
                wall[name].append(elapsed)
                spent[name].append(used)
        if hook_sid:     # every call answered in the one session: the reuse path was timed
            last = json.loads(timed(cases["hook"][0], env, payload)[2].stdout)
            assert hook_sid in last["hookSpecificOutput"]["updatedInput"]["command"]
        med = {name: statistics.median(s) * 1000 for name, s in wall.items()}
        cpu_med = {name: statistics.median(s) * 1000 for name, s in spent.items()}
        out = {"python": python, "runs": runs, "backend": backend,
               "baseline_ms": med["baseline"], "baseline_cpu_ms": cpu_med["baseline"]}
        for name, target in TARGETS.items():
            if name in med:
                out[name] = {"ms": med[name], "ratio": med[name] / med["baseline"],
                             "cpu_ms": cpu_med[name],
                             "cpu_ratio": cpu_med[name] / cpu_med["baseline"], "target": target}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


LABELS = {"help": "overlord --help", "exec": "overlord exec SID -- true",
          "hook": "overlord hook claude-code"}


def report(out):
    lines = [f"python3 -c pass            {out['baseline_ms']:6.2f} ms  (CPU {out['baseline_cpu_ms']:.2f} "
             f"ms; {out['python']})"]
    for name, label in LABELS.items():
        r = out.get(name)
        if r is None:
            lines.append(f"{label:26s}  (not available)")
            continue
        lines.append(f"{label:26s} {r['ms']:6.2f} ms  ratio {r['ratio']:.2f} "
                     f"(target <= {r['target']}; CPU ratio {r['cpu_ratio']:.2f})")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=40, help="rounds per median (default 40)")
    p.add_argument("--python", default=sys.executable, help="the interpreter to time "
                   "(default: this one)")
    p.add_argument("--backend", choices=("kernel", "fuse"), default="kernel")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = bench(args.python, args.runs, args.backend)
    out["machine"] = (f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                      f"Linux {platform.release()}, Python {platform.python_version()}")
    print(json.dumps(out, indent=2) if args.json else report(out))


if __name__ == "__main__":
    main()
