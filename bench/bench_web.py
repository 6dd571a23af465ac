"""`overlord ui` under load: latency of the JSON API with many keep-alive clients, and how
fast a streamed token reaches the browser.

    python3 bench/bench_web.py [--clients 50] [--requests 40] [--runs 20] [--json]

1. GET /api/sessions: p50 / p99 with N concurrent keep-alive clients (a register of 30 sessions),
   and with one client for reference.
2. GET /api/session/<sid>, the diff view (dossier and inspector) of a 200-file change (each file
   of 60 lines with one line changed): p50 / p99 with the same N clients.
3. Time to first token: a conversation against a fake Anthropic endpoint on loopback; the fake
   notes when it writes its first text delta, an event-stream client (what the page does) notes
   when that delta arrives. Reported: the relay's own delay (arrival - the fake's first byte),
   p50 / p99 over the runs, and both times from the POST that started the conversation.

The server runs as `overlord ui` does (its own process, its launcher forked first). Clients run
in several processes (threads within each), so the clients' own interpreter lock does not time
the server. Figures go in docs/PERFORMANCE.md with the machine they ran on.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "test", "agent"))

from fakes import KEY, AnthropicFake, sse_text  # noqa: E402

URL_RE = re.compile(r"http://127\.0\.0\.1:(\d+)/\?token=([0-9a-f]+)")


def percentile(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(samples):
    ms = [x * 1000 for x in samples]
    return {"p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
            "mean_ms": round(statistics.fmean(ms), 2), "n": len(ms)}


class Server:
    def __init__(self, home, folder):
        env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO, OVERLORD_RETRY_SCALE="0",
                   http_proxy="", https_proxy="", no_proxy="*")
        self.log = open(os.path.join(home, "ui.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "overlord", "ui", "--port", "0",
                                      "--folder", folder], env=env, stdout=subprocess.PIPE,
                                     stderr=self.log)
        line = self.proc.stdout.readline().decode()
        m = URL_RE.search(line)
        if not m:
            raise SystemExit(f"overlord ui did not start: {line!r}")
        self.port, self.token = int(m.group(1)), m.group(2)

    def headers(self):
        return {"Host": f"127.0.0.1:{self.port}", "Authorization": f"Bearer {self.token}"}

    def call(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = self.headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        res = conn.getresponse()
        out = json.loads(res.read())
        conn.close()
        if res.status != 200:
            raise SystemExit(f"{method} {path}: {res.status} {out}")
        return out

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


# -- 1 and 2: latency under concurrent keep-alive clients ---------------------------------------

def _client_process(port, token, path, threads, requests, start, out):
    def one(results):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {token}"}
        conn.request("GET", path, headers=headers)      # warm the connection
        conn.getresponse().read()
        start.wait()
        for _ in range(requests):
            t = time.perf_counter()
            conn.request("GET", path, headers=headers)
            res = conn.getresponse()
            res.read()
            results.append(time.perf_counter() - t)
            assert res.status == 200, res.status
        conn.close()
    results = []
    workers = [threading.Thread(target=one, args=(results,)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(results)


def load(server, path, clients, requests, procs=10):
    procs = min(procs, clients)
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    start, out = multiprocessing.Event(), multiprocessing.Queue()
    ps = [multiprocessing.Process(target=_client_process, args=(server.port, server.token, path, n,
                                                                 requests, start, out)) for n in per]
    for p in ps:
        p.start()
    time.sleep(1.0)                          # every connection open and warm
    t = time.perf_counter()
    start.set()
    samples = []
    for _ in ps:
        samples += out.get(timeout=600)
    wall = time.perf_counter() - t
    for p in ps:
        p.join()
    res = summary(samples)
    res["requests_per_s"] = round(len(samples) / wall, 1)
    return res


def make_change(home, target, files=200, lines=60):
    for i in range(files):
        with open(os.path.join(target, f"m{i:03d}.txt"), "w") as f:
            f.write("".join(f"line {n} of file {i}\n" for n in range(lines)))
    env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO)
    script = "for f in m*.txt; do sed -i 's/^line 30 of/changed 30 of/' \"$f\"; done"
    out = subprocess.run([sys.executable, "-m", "overlord", "run", "-t", target, "--", "sh", "-c",
                          script], env=env, capture_output=True, text=True, check=True).stdout
    return re.search(r"^session (\S+)", out, re.M).group(1)


def register(home, tmp, count=29):
    env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO)
    for i in range(count):
        t = os.path.join(tmp, f"reg{i}")
        os.mkdir(t)
        subprocess.run([sys.executable, "-m", "overlord", "run", "-t", t, "--", "sh", "-c",
                        f"echo {i} > r.txt"], env=env, capture_output=True, check=True)


# -- 3: time to the first streamed token --------------------------------------------------------------

class Timed:
    """A streamed answer that notes when its first text delta leaves the fake."""

    def __init__(self, answer, marks):
        self.answer, self.marks = answer, marks

    def send(self, h):
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        for c in sse_text(self.answer.events):
            data = c.encode()
            if "first_byte" not in self.marks and b"text_delta" in data:
                self.marks["first_byte"] = time.monotonic()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")


def first_token(server, fake, tmp, runs):
    relay, from_post, fake_from_post = [], [], []
    server.call("PUT", "/api/settings", {"provider": "anthropic", "api_key": KEY,
                                         "profile": {"model": fake.MODEL, "base_url": fake.url}})
    for i in range(runs):
        folder = os.path.join(tmp, f"ttft{i}")
        os.mkdir(folder)
        marks = {}
        fake.queue(Timed(fake.turn(text="The first words of a reply, then more."), marks))
        t0 = time.monotonic()
        sid = server.call("POST", "/api/chats", {"message": "say something", "folder": folder})["sid"]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", f"/api/chats/{sid}/events", headers=server.headers())
        res = conn.getresponse()
        arrived = None
        while arrived is None:
            line = res.fp.readline()
            if not line:
                raise SystemExit("the event stream ended before a delta")
            if line.startswith(b"event: delta"):
                arrived = time.monotonic()
            elif line.startswith(b"data: ") and b'"partial": {"text": "The' in line:
                arrived = time.monotonic()       # the delta landed before the page connected
        conn.close()
        relay.append(arrived - marks["first_byte"])
        from_post.append(arrived - t0)
        fake_from_post.append(marks["first_byte"] - t0)
        deadline = time.monotonic() + 30
        while server.call("GET", f"/api/chats/{sid}")["chat"]["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        server.call("POST", f"/api/session/{sid}/rollback", {})
    return {"relay": summary(relay), "browser_from_post": summary(from_post),
            "fake_first_byte_from_post": summary(fake_from_post)}


def machine():
    return (f"{platform.machine()} {os.cpu_count()} cpus, Linux {platform.release().split('-')[0]}, "
            f"Python {platform.python_version()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=40, help="requests per client")
    ap.add_argument("--runs", type=int, default=20, help="conversations for time to first token")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="overlord-bench-web-")
    home = os.path.join(tmp, "home")
    target = os.path.join(tmp, "target")
    os.mkdir(home)
    os.mkdir(target)
    fake = AnthropicFake()
    server = None
    try:
        sid = make_change(home, target)
        register(home, tmp)
        server = Server(home, target)
        view = server.call("GET", f"/api/session/{sid}")
        assert len(view["diffs"]) == 200 and all(d["hunks"] for d in view["diffs"])
        body = len(json.dumps(view))
        results = {
            "machine": machine(),
            "sessions_one_client": load(server, "/api/sessions", 1, args.requests),
            "diff_view_one_client": load(server, f"/api/session/{sid}", 1, args.requests),
            "sessions": load(server, "/api/sessions", args.clients, args.requests),
            "diff_view": dict(load(server, f"/api/session/{sid}", args.clients, max(4, args.requests // 4)),
                              bytes=body),
            "first_token": first_token(server, fake, tmp, args.runs),
        }
    finally:
        if server:
            server.close()
        fake.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    s, d, f = results["sessions"], results["diff_view"], results["first_token"]
    s1, d1 = results["sessions_one_client"], results["diff_view_one_client"]
    print(f"machine: {results['machine']}")
    print(f"one client: GET /api/sessions p50 {s1['p50_ms']:.2f} ms, diff view p50 {d1['p50_ms']:.2f} ms")
    print(f"{args.clients} keep-alive clients:")
    print(f"GET /api/sessions (30 sessions)   p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  "
          f"({s['requests_per_s']} req/s)")
    print(f"diff view, 200-file change        p50 {d['p50_ms']:7.2f} ms  p99 {d['p99_ms']:7.2f} ms  "
          f"({d['requests_per_s']} req/s, {d['bytes'] // 1024} KiB)")
    print(f"first token relayed to the page    p50 {f['relay']['p50_ms']:7.2f} ms  p99 {f['relay']['p99_ms']:7.2f} ms "
          f"after the fake's first byte; from the POST: page {f['browser_from_post']['p50_ms']:.1f} ms, "
          f"fake {f['fake_first_byte_from_post']['p50_ms']:.1f} ms (p50)")


if __name__ == "__main__":
    main()
