"""The daemon through the SDK: one exec's cost, and many clients at once.

    python3 bench/bench_daemon.py [--runs 60] [--clients 50] [--execs 20] [--backend kernel|fuse]
                                  [--processes] [--profile] [--json]

1. `exec` of `true` in an open session through the daemon -- the SDK call to its reply:
   overlord_client -> JSON line -> the daemon -> ops.Broker (policy) -> the launcher's worker
   -> ops.exec_in -- against the same `ops.exec_in` made in this process (no daemon, no
   launcher), both in sessions with the brokered grants (jailed and offline on the kernel
   backend). Median of --runs each, interleaved in rounds; the issue asks for <= 1.3x.
   The in-process samples are taken while this process has no other thread (the SDK's reader
   thread is stopped between rounds), as the engine requires of a process that clones.
2. --clients SDK clients at once (threads, or with --processes one process each), each
   opening its own session on its own target folder (all covered by one policy `targets`
   entry) and running --execs execs of `true` in it: no failure allowed; p50 / p99 / max of
   the exec latencies and the wall time.

--profile adds where (1)'s time goes, each piece a median of --runs: in this process
`ops.exec_in`, `ops.exec_capture` (the output through pipes, as the daemon streams it) and
`ops.Broker.exec` (that plus the policy checks); the same two through a launcher (the worker
that runs a threaded face's commands); and an SDK ping (socket + JSON + the daemon's loop).
Figures are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import overlord_client as oc  # noqa: E402
from bench_mcp import brokered_grants, folder, fresh_home, median_ms, timed  # noqa: E402 - bench/'s helpers
from overlord import ops  # noqa: E402

TRUE = ["true"]


def pct_ms(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000


class Daemon:
    """`overlord daemon --socket PATH` in a child process, with this process's OVERLORD_HOME."""

    def __init__(self, tmp, backend):
        self.socket = os.path.join(tmp, "overlordd.sock")
        env = dict(os.environ, PYTHONPATH=REPO)
        if backend:
            env["OVERLORD_TEST_BACKEND"] = backend
        self.log = open(os.path.join(tmp, "daemon.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "overlord", "daemon", "--socket",
                                      self.socket], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with oc.Client(self.socket) as c:
                    c.ping()
                return
            except oc.OverlordError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    with open(self.log.name, "rb") as f:
                        raise SystemExit("the daemon did not start:\n" + f.read().decode(errors="replace"))
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def write_policy(home, tmp):
    path = os.path.join(home, "policy.json")
    with open(path, "w") as f:
        json.dump({"targets": {tmp: {}}}, f)
    os.chmod(path, 0o600)


# -- 1. one exec -----------------------------------------------------------------------------

def bench_one_exec(tmp, daemon, runs, backend, rounds=6):
    grants = brokered_grants(backend)
    local = ops.run(TRUE, target=folder(tmp, "local"), backend=backend, grants=grants,
                    close_if_unchanged=False).sid
    with oc.Client(daemon.socket) as c:
        remote = c.open(folder(tmp, "remote"), backend=backend, **grants).sid
    ours, theirs = [], []
    per = max(1, runs // rounds)
    for _ in range(rounds):
        assert threading.active_count() == 1, "the engine clones only from a one-thread process"
        theirs += [timed(lambda: ops.exec_in(local, TRUE)) for _ in range(per)]
        with oc.Client(daemon.socket) as c:
            c.ping()                                # connected before the clock starts
            ours += [timed(lambda: c.exec(remote, TRUE)) for _ in range(per)]
    with oc.Client(daemon.socket) as c:
        c.rollback(remote)
    ops.rollback(local)
    return {"daemon_ms": median_ms(ours), "in_process_ms": median_ms(theirs),
            "ratio": median_ms(ours) / median_ms(theirs), "target": 1.3, "runs": len(ours),
            "grants": grants}


def bench_profile(tmp, daemon, runs, backend):
    """Where one daemon exec's time goes, piece by piece (each a median of runs)."""
    from overlord.ops import launcher
    grants = brokered_grants(backend)
    with oc.Client(daemon.socket) as c:
        c.ping()
        ping = [timed(c.ping) for _ in range(runs)]
    sid = ops.run(TRUE, target=folder(tmp, "profile"), backend=backend, grants=grants,
                  close_if_unchanged=False).sid
    broker = ops.Broker(ops.Caller("daemon", "bench"))
    direct, capture, brokered = [], [], []
    for _ in range(runs):           # interleaved
        direct.append(timed(lambda: ops.exec_in(sid, TRUE)))
        capture.append(timed(lambda: ops.exec_capture(sid, TRUE)))
        brokered.append(timed(lambda: broker.exec(sid, TRUE)))
    # a child process: a launcher, once started, stays for the life of its process's threads
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            with launcher.serving():
                via, via_broker = [], []
                for _ in range(runs):
                    via.append(timed(lambda: ops.exec_in(sid, TRUE)))
                    via_broker.append(timed(lambda: broker.exec(sid, TRUE)))
            os.write(w, json.dumps({"launcher": via, "broker": via_broker}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    child = json.loads(data)
    ops.rollback(sid)
    return {"ping_ms": median_ms(ping), "exec_in_ms": median_ms(direct),
            "exec_capture_ms": median_ms(capture), "broker_exec_ms": median_ms(brokered),
            "exec_in_via_launcher_ms": median_ms(child["launcher"]),
            "broker_exec_via_launcher_ms": median_ms(child["broker"])}


# -- 2. many clients -------------------------------------------------------------------------

def one_client(socket_path, target, execs, backend, grants):
    """Open a session, run execs of `true`: (latencies, failures)."""
    lat, failures = [], []
    try:
        with oc.Client(socket_path) as c:
            live = c.open(target, backend=backend, **grants)
            for _ in range(execs):
                t = time.perf_counter()
                try:
                    r = live.exec(TRUE)
                    if r.exit_code != 0:
                        failures.append(f"exit {r.exit_code}")
                except oc.OverlordError as exc:
                    failures.append(f"{exc.code} {exc}")
                lat.append(time.perf_counter() - t)
            live.close()
            c.rollback(live.sid)
    except oc.OverlordError as exc:
        failures.append(f"{exc.code} {exc}")
    return lat, failures


def bench_clients(tmp, daemon, clients, execs, backend, processes):
    grants = brokered_grants(backend)
    targets = [folder(tmp, f"client{i}") for i in range(clients)]
    lat, failures = [], []
    t0 = time.perf_counter()
    if processes:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                   daemon.socket, t, str(execs), backend or "",
                                   json.dumps(grants)], stdout=subprocess.PIPE)
                 for t in targets]
        for p in procs:
            out, _ = p.communicate()
            try:
                got = json.loads(out)
            except ValueError:
                got = [[], [f"worker exited {p.returncode} without a report"]]
            lat += got[0]
            failures += got[1]
    else:
        results = [None] * clients

        def work(i):
            results[i] = one_client(daemon.socket, targets[i], execs, backend, grants)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for got in results:
            lat += got[0]
            failures += got[1]
    wall = time.perf_counter() - t0
    return {"clients": clients, "execs_each": execs, "mode": "processes" if processes else "threads",
            "execs": len(lat), "failures": len(failures), "first_failures": failures[:3],
            "p50_ms": pct_ms(lat, 50) if lat else None, "p99_ms": pct_ms(lat, 99) if lat else None,
            "max_ms": max(lat) * 1000 if lat else None, "wall_s": wall,
            "execs_per_s": len(lat) / wall if wall else None}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, sock, target, execs, backend, grants = sys.argv
        print(json.dumps(one_client(sock, target, int(execs), backend or None, json.loads(grants))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--execs", type=int, default=20)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--processes", action="store_true", help="one process per client")
    ap.add_argument("--profile", action="store_true", help="where one exec's time goes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp, home = fresh_home("ovl-bench-daemon-")
    write_policy(home, tmp)
    daemon = Daemon(tmp, args.backend)
    out = {}
    try:
        out["exec"] = bench_one_exec(tmp, daemon, args.runs, args.backend)
        if args.profile:
            out["profile"] = bench_profile(tmp, daemon, args.runs, args.backend)
        out["clients"] = bench_clients(tmp, daemon, args.clients, args.execs, args.backend,
                                       args.processes)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    e = out["exec"]
    print(f"exec of `true` through the daemon (SDK call to reply): {e['daemon_ms']:.2f} ms vs "
          f"{e['in_process_ms']:.2f} ms ops.exec_in in process ({e['ratio']:.2f}x; target <= 1.3x; "
          f"median of {e['runs']}, grants {e['grants']})")
    if "profile" in out:
        p = out["profile"]
        print(f"  where it goes (in process unless said): ops.exec_in {p['exec_in_ms']:.2f} ms; "
              f"ops.exec_capture (output through pipes) {p['exec_capture_ms']:.2f} ms; "
              f"Broker.exec (+ policy) {p['broker_exec_ms']:.2f} ms; through a launcher: "
              f"ops.exec_in {p['exec_in_via_launcher_ms']:.2f} ms, Broker.exec "
              f"{p['broker_exec_via_launcher_ms']:.2f} ms; an SDK ping round trip "
              f"{p['ping_ms']:.2f} ms")
    c = out["clients"]
    print(f"{c['clients']} concurrent SDK clients ({c['mode']}) x {c['execs_each']} execs: "
          f"{c['failures']} failures of {c['execs']}; p50 {c['p50_ms']:.1f} ms, p99 "
          f"{c['p99_ms']:.1f} ms, max {c['max_ms']:.1f} ms; {c['execs_per_s']:.0f} execs/s "
          f"({c['wall_s']:.1f} s)")
    for f in c["first_failures"]:
        print(f"  failure: {f}")


if __name__ == "__main__":
    main()
