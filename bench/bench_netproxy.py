"""OVERLORD egress proxy benchmarks: ratios against a direct baseline measured in the same run.

    python3 bench/bench_netproxy.py [--mib 100] [--requests 500] [--json]

The proxy runs in a forked process of its own, as the session holder's back does (a proxy
sharing the benchmark's interpreter would share its GIL with the client and the upstream).

1. throughput: a 100 MiB download from a local upstream (127.0.0.1) through the proxy
   (overlord/sandbox/netproxy.py on a 127.0.0.1 listener) vs the same download direct;
   target ratio >= 0.5.
2. latency: a small GET through the proxy vs direct, p50 of each over ~500 requests
   (a new connection per request, as the proxy serves one request per connection);
   target: added p50 <= 2 ms.

Figures and the machine they ran on are recorded in docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "egress"))

from proxylib import Upstream, read_log, resolver  # noqa: E402

from overlord.sandbox import netproxy  # noqa: E402

BUF = 1024 * 1024


def fetch(port, request):
    """Send a request on a new connection to 127.0.0.1:port, read to close; bytes read."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(request)
        buf = bytearray(BUF)
        total = 0
        while True:
            n = s.recv_into(buf)
            if not n:
                return total
            total += n


def bench_throughput(up, px, mib, runs=3):
    size = mib * 1024 * 1024
    direct_req = f"GET /bytes/{size} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n".encode()
    proxy_req = (f"GET http://up.test:{up.port}/bytes/{size} HTTP/1.1\r\nHost: up.test\r\n\r\n").encode()
    direct, proxied = [], []
    for _ in range(runs):
        t = time.perf_counter()
        assert fetch(up.port, direct_req) >= size
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert fetch(px.port, proxy_req) >= size
        proxied.append(time.perf_counter() - t)
    d, p = min(direct), min(proxied)
    return {"mib": mib, "direct_mib_s": mib / d, "proxy_mib_s": mib / p, "ratio": d / p,
            "target": 0.5, "runs": runs}


def bench_latency(up, px, n):
    direct_req = b"GET /bytes/100 HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n"
    proxy_req = f"GET http://up.test:{up.port}/bytes/100 HTTP/1.1\r\nHost: up.test\r\n\r\n".encode()
    direct, proxied = [], []
    for _ in range(20):                          # warm up
        fetch(up.port, direct_req)
        fetch(px.port, proxy_req)
    for _ in range(n):
        t = time.perf_counter()
        fetch(up.port, direct_req)
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        fetch(px.port, proxy_req)
        proxied.append(time.perf_counter() - t)
    d = statistics.median(direct) * 1000
    p = statistics.median(proxied) * 1000
    return {"requests": n, "direct_p50_ms": d, "proxy_p50_ms": p, "added_p50_ms": p - d,
            "target_added_ms": 2.0}


class ForkedProxy:
    """netproxy.serve on a 127.0.0.1 listener in a forked child (the holder's back B)."""

    def __init__(self, record_dir, allow, names):
        os.makedirs(record_dir, exist_ok=True)
        self.record_dir = record_dir
        self.config = netproxy.Config(record_dir=record_dir, allow=allow,
                                      getaddrinfo=resolver(names))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port = self.listener.getsockname()[1]

    def __enter__(self):
        self.pid = os.fork()
        if self.pid == 0:
            try:
                netproxy.serve(self.listener, self.config)
            finally:
                os._exit(0)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        self.listener.close()

    def lines(self):
        return read_log(self.record_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, Upstream() as up, \
            ForkedProxy(os.path.join(tmp, "sess"), ["up.test"], {"up.test": "127.0.0.1"}) as px:
        results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                               "kernel": platform.release()},
                   "throughput": bench_throughput(up, px, args.mib),
                   "latency": bench_latency(up, px, args.requests)}
        lines = px.lines()
    results["egress_lines"] = len(lines)
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        t, lat = results["throughput"], results["latency"]
        print(f"throughput {t['mib']} MiB: direct {t['direct_mib_s']:.0f} MiB/s, proxy "
              f"{t['proxy_mib_s']:.0f} MiB/s, ratio {t['ratio']:.2f} (target >= {t['target']})")
        print(f"latency p50 over {lat['requests']}: direct {lat['direct_p50_ms']:.3f} ms, proxy "
              f"{lat['proxy_p50_ms']:.3f} ms, added {lat['added_p50_ms']:.3f} ms "
              f"(target <= {lat['target_added_ms']})")
    ok = results["throughput"]["ratio"] >= 0.5 and results["latency"]["added_p50_ms"] <= 2.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
