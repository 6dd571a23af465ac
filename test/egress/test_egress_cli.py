"""The egress faces: --net/--net-allow/--hold-writes become grants (bad input one line, no
session), `overlord egress` (table, HELD REQUESTS, --json) over records written in the
session directory in the brief's formats, commit --release-held / --release ID / the default
drop and rollback's drop with their audit acts, escaping of what a remote or the sandbox chose,
the diff note, and one end-to-end run through the real proxy with curl."""
import base64
import http.server
import json
import os
import threading
import time

import pytest

from conftest import Ovl, require_backend, require_tool, tree


@pytest.fixture
def ovl(home):
    return Ovl(home)


def sessions(home):
    d = home / "sessions"
    return sorted(os.listdir(d)) if d.exists() else []


def meta(home, sid):
    return json.loads((home / "sessions" / sid / "meta.json").read_text())


def audit_lines(home, action):
    path = home / "audit.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [x for x in lines if x["action"] == action]


def proxy_session(ovl, home, target, allow=("127.0.0.1",)):
    """A pending session whose record says --net proxy --hold-writes (the records below are
    written as the proxy would write them)."""
    sid, _ = ovl.sh(target, "echo new > new.txt")
    path = home / "sessions" / sid / "meta.json"
    m = json.loads(path.read_text())
    m["grants"] = dict(m.get("grants") or {}, net="proxy", net_allow=list(allow), hold_writes=True)
    path.write_text(json.dumps(m))
    return sid


def write_log(home, sid, lines):
    with open(home / "sessions" / sid / "egress.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def line(**kw):
    base = {"ts": time.time(), "host": "pypi.org", "port": 443, "method": "CONNECT", "path": None,
            "allowed": True, "status": 200, "bytes_up": 100, "bytes_down": 2000,
            "duration_ms": 12.5, "layer": 0, "cause": "pip download x", "reason": None,
            "held": None}
    base.update(kw)
    return base


def write_held(home, sid, n, url, method="POST", body=b"{}", headers=None, state="held"):
    d = home / "sessions" / sid / "held"
    d.mkdir(mode=0o700, exist_ok=True)
    hid = f"h{n:04d}"
    host_port = url.split("/")[2]
    host, _, port = host_port.rpartition(":")
    rec = {"id": hid, "ts": time.time(), "method": method, "url": url, "host": host,
           "port": int(port), "path": "/" + url.split("/", 3)[3], "headers":
           headers or [["Host", host_port], ["Content-Type", "application/json"],
                       ["Authorization", "Bearer sekrit-token"]],
           "body_b64": base64.b64encode(body).decode(), "bytes": len(body), "layer": 0,
           "cause": "curl -X POST", "state": state, "status": None, "error": None,
           "released_at": None}
    (d / f"{hid}.json").write_text(json.dumps(rec))
    os.chmod(d / f"{hid}.json", 0o600)
    return hid


class Upstream:
    """An HTTP server on 127.0.0.1 (host namespace) that records what it was sent."""

    def __init__(self):
        self.got = []
        got = self.got

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                got.append((self.command, self.path, dict(self.headers), self.rfile.read(n)))
                body = b"ok\n"
                self.send_response(201 if self.command != "GET" else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


# -- flags become grants ----------------------------------------------------------------------

def test_net_flags_become_grants(home, target):
    require_backend("kernel")
    ovl = Ovl(home, "kernel")
    sid, proc = ovl.sh(target, "echo x > f", flags=["--net", "proxy", "--net-allow", "Example.COM.",
                                                     "--net-allow", "*.pypi.org", "--net-allow",
                                                     "example.com", "--hold-writes"])
    assert sid, proc.err
    g = meta(home, sid)["grants"]
    assert g["net"] == "proxy" and g["net_allow"] == ["example.com", "*.pypi.org"]
    assert g["hold_writes"] is True


def test_manifest_keys_net_allow_and_hold_writes(home, target, tmp_path):
    require_backend("kernel")
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"net": "proxy", "net_allow": ["A.example"], "hold_writes": True}))
    sid, proc = Ovl(home, "kernel").sh(target, "echo x > f", flags=["--manifest", m])
    assert sid, proc.err
    g = meta(home, sid)["grants"]
    assert (g["net"], g["net_allow"], g["hold_writes"]) == ("proxy", ["a.example"], True)


@pytest.mark.parametrize("flags,says,code", [
    (["--net-allow", "x.org"], "--net-allow needs --net proxy (this session's network is host)", 2),
    (["--hold-writes"], "--hold-writes needs --net proxy (this session's network is host)", 2),
    (["--net", "none", "--net-allow", "x.org"], "--net-allow needs --net proxy (this session's "
                                                "network is none)", 2),
    (["--net", "proxy", "--net-allow", ""], "--net-allow: an empty allowlist entry", 2),
    (["--net", "proxy", "--net-allow", "http://x.org/"], "--net-allow: allowlist entry "
                                                         "'http://x.org/' is not a host name", 2),
    (["--net", "proxy", "--net-allow", "a*.org"], "--net-allow: allowlist entry 'a*.org': a "
                                                  "wildcard is only allowed as a leading '*.'", 2),
    (["--net", "proxy", "--net-allow", "a b"], "--net-allow: allowlist entry 'a b' contains white "
                                               "space", 2),
])
def test_bad_net_flags_one_line_no_session(ovl, home, target, flags, says, code):
    before = tree(target)
    for cmd in (["run", "-t", target, *flags, "--", "sh", "-c", "echo x > f"],
                ["shell", "-t", target, *flags]):
        proc = ovl(*cmd, input=b"echo x > f\n")
        assert proc.returncode == code, (proc.returncode, proc.err)
        assert proc.err.startswith(f"overlord: {says}") and len(proc.err.splitlines()) == 1, proc.err
        assert "Traceback" not in proc.err
    assert sessions(home) == [] and tree(target) == before


def test_bad_manifest_allowlist_one_line(ovl, home, target, tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"net": "none", "net_allow": ["ok.org"]}))
    proc = ovl("run", "-t", target, "--manifest", m, "--", "true")
    assert proc.returncode == 2 and proc.err == ("overlord: --net-allow needs --net proxy (this "
                                                 "session's network is none)\n")
    m.write_text(json.dumps({"net": "proxy", "net_allow": ["ok.org", "bad/x"]}))
    proc = ovl("run", "-t", target, "--manifest", m, "--", "true")
    assert proc.returncode == 2 and len(proc.err.splitlines()) == 1
    assert "allowlist entry 'bad/x' is not a host name" in proc.err
    assert sessions(home) == []


def test_exec_takes_no_network_flags(ovl, home, target):
    sid, _ = ovl.sh(target, "echo x > f")
    proc = ovl("exec", sid, "--net", "proxy", "--", "true")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.err


# -- overlord egress ----------------------------------------------------------------------------

HOSTILE = "evil\x1b]0;owned\x07.example"


def test_egress_table_json_and_escaping(ovl, home, target):
    sid = proxy_session(ovl, home, target)
    write_log(home, sid, [
        line(),
        line(host=HOSTILE, port=80, method="GET", path="/a\x1b[2Jb?q=\r\n", allowed=False,
             status=403, bytes_up=0, bytes_down=0, reason="not in this session's allowlist",
             cause="curl \x1b[31mred"),
        line(host="127.0.0.1", port=8080, method="POST", path="/up", status=202, held="h0001"),
    ])
    with open(home / "sessions" / sid / "egress.jsonl", "a") as f:
        f.write('{"ts": 1, "host": "torn')               # a torn last line is tolerated
    write_held(home, sid, 1, "http://127.0.0.1:8080/up?x=\x1b[1m", headers=[
        ["Host", "127.0.0.1:8080"], ["Authorization", "Bearer sekrit-token"],
        ["X-Api-Key", "sekrit-key"], ["Cookie", "s=sekrit-cookie"],
        ["X-Evil\x1b[8m", "v\x1b]52;c;AAAA\x07"]])
    proc = ovl("egress", sid, check=0)
    out = proc.out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "sekrit" not in out
    lines = out.splitlines()
    assert lines[0].startswith(f"egress of {sid} (net proxy; allow 127.0.0.1; writes held): "
                               "3 connections, 1 refused")
    assert lines[1].split() == ["TIME", "HOST", "PORT", "METHOD", "PATH", "ALLOWED", "STATUS", "UP",
                                "DOWN", "MS", "CMD"]
    row = lines[2].split()
    assert row[1:8] == ["pypi.org", "443", "CONNECT", "-", "yes", "200", "100"]
    assert "evil\\x1b]0;owned\\x07.example" in lines[3] and "REFUSED" in lines[3]
    assert "/a\\x1b[2Jb?q=\\r\\n" in lines[3] and "@0 curl \\x1b[31mred" in lines[3]
    assert "held h0001" in lines[4]
    i = lines.index("HELD REQUESTS (1 held)")
    assert lines[i + 1].split() == ["h0001", "POST", "http://127.0.0.1:8080/up?x=\\x1b[1m", "held"]
    assert "X-Evil\\x1b[8m" in out and "\\x1b]52;c;AAAA\\x07" in out

    data = json.loads(ovl("egress", sid, "--json", check=0).out)
    assert set(data) >= {"sid", "net", "allow", "hold_writes", "connections", "held", "summary"}
    assert (data["sid"], data["net"], data["allow"], data["hold_writes"]) == \
        (sid, "proxy", ["127.0.0.1"], True)
    assert [c["host"] for c in data["connections"]] == ["pypi.org", HOSTILE, "127.0.0.1"]
    s = data["summary"]
    assert (s["connections"], s["refused"], s["bytes_up"], s["bytes_down"], s["held"]) == \
        (3, 1, 200, 4000, 1)
    [h] = data["held"]
    assert h["id"] == "h0001" and h["state"] == "held"
    assert "sekrit" not in json.dumps(data)
    assert ovl("egress", "last", "--json", check=0).out == ovl("egress", sid, "--json", check=0).out


def test_egress_of_a_session_without_proxy(ovl, home, target):
    sid, _ = ovl.sh(target, "echo x > f")
    proc = ovl("egress", sid, check=0)
    assert "0 connections" in proc.out and "not proxy" in proc.out
    data = json.loads(ovl("egress", sid, "--json", check=0).out)
    assert data["connections"] == [] and data["held"] == [] and data["summary"]["held"] == 0
    proc = ovl("egress", "20990101-000000-abcdef")
    assert proc.returncode != 0 and proc.err.startswith("overlord: ") and len(proc.err.splitlines()) == 1


# -- commit and rollback: released or dropped, audited -------------------------------------------

def test_diff_notes_waiting_held_requests(ovl, home, target):
    sid = proxy_session(ovl, home, target)
    plain = ovl("diff", sid, check=0)
    assert plain.err == ""
    write_held(home, sid, 1, "http://127.0.0.1:1/a")
    write_held(home, sid, 2, "http://127.0.0.1:1/b")
    proc = ovl("diff", sid, check=0)
    assert proc.out == plain.out == "added  new.txt\n"
    assert proc.err == f"overlord: note: 2 held requests wait for commit (overlord egress {sid})\n"
    js = ovl("diff", sid, "--json", check=0)
    assert json.loads(js.out)[0]["path"] == "new.txt" and "2 held requests" in js.err


def test_commit_release_held_sends_all_in_order(ovl, home, target, upstream):
    sid = proxy_session(ovl, home, target)
    base = f"http://127.0.0.1:{upstream.port}"
    write_held(home, sid, 1, f"{base}/one", body=b'{"n": 1}')
    write_held(home, sid, 2, f"{base}/two", method="PUT", body=b'{"n": 2}')
    assert upstream.got == []                      # held: nothing went out before commit
    proc = ovl("commit", sid, "--release-held", check=0)
    assert (target / "new.txt").read_text() == "new\n"
    assert [(m, p, b) for m, p, _h, b in upstream.got] == [("POST", "/one", b'{"n": 1}'),
                                                           ("PUT", "/two", b'{"n": 2}')]
    lines = proc.out.splitlines()
    assert lines[0].startswith(f"committed {sid}: 1 change")
    assert lines[1].split() == ["released", "h0001", "POST", f"{base}/one", "->", "201"]
    assert lines[2].split() == ["released", "h0002", "PUT", f"{base}/two", "->", "201"]
    acts = audit_lines(home, "egress.release")
    assert [(a["sid"], a["id"], a["method"], a["host"], a["path"], a["status"], a["error"])
            for a in acts] == [(sid, "h0001", "POST", "127.0.0.1", "/one", 201, None),
                               (sid, "h0002", "PUT", "127.0.0.1", "/two", 201, None)]
    assert audit_lines(home, "egress.drop") == []
    commit_seq = audit_lines(home, "session.commit")[-1]["seq"]
    assert all(a["seq"] > commit_seq for a in acts)          # after the tree landed
    held = json.loads(ovl("egress", sid, "--json", check=0).out)["held"]
    assert [(h["id"], h["state"], h["status"]) for h in held] == [("h0001", "released", 201),
                                                                   ("h0002", "released", 201)]


def test_commit_release_some_drops_the_rest(ovl, home, target, upstream):
    sid = proxy_session(ovl, home, target)
    base = f"http://127.0.0.1:{upstream.port}"
    for n in (1, 2, 3):
        write_held(home, sid, n, f"{base}/{n}")
    proc = ovl("commit", sid, "--release", "h0003", "--release", "h0001", check=0)
    assert [p for _m, p, _h, _b in upstream.got] == ["/1", "/3"]        # id order
    assert "dropped 1 held request: h0002" in proc.out
    assert [a["id"] for a in audit_lines(home, "egress.release")] == ["h0001", "h0003"]
    [drop] = audit_lines(home, "egress.drop")
    assert drop["sid"] == sid and drop["ids"] == ["h0002"]


def test_commit_unknown_id_is_refused_before_anything_lands(ovl, home, target, upstream):
    sid = proxy_session(ovl, home, target)
    write_held(home, sid, 1, f"http://127.0.0.1:{upstream.port}/1")
    before = tree(target)
    for ids in (["h0009"], ["h0001", "nope\x1b"]):
        proc = ovl("commit", sid, *[a for i in ids for a in ("--release", i)])
        assert proc.returncode == 2 and len(proc.err.splitlines()) == 1, proc.err
        assert proc.err.startswith("overlord: cannot release ") and "\x1b" not in proc.err
        assert "(waiting: h0001)" in proc.err
    proc = ovl("commit", sid, "--release-held", "--release", "h0001")
    assert proc.returncode == 2 and len(proc.err.splitlines()) == 1
    assert tree(target) == before and upstream.got == []
    assert meta(home, sid)["state"] == "pending"
    assert audit_lines(home, "egress.release") == audit_lines(home, "egress.drop") == []


def test_a_refused_commit_releases_nothing(ovl, home, target, upstream):
    sid = proxy_session(ovl, home, target)
    write_held(home, sid, 1, f"http://127.0.0.1:{upstream.port}/1")
    (target / "new.txt").write_text("drift\n")            # an outside change: commit refuses
    proc = ovl("commit", sid, "--release-held")
    assert proc.returncode != 0 and upstream.got == []
    assert audit_lines(home, "egress.release") == []
    assert json.loads(ovl("egress", sid, "--json", check=0).out)["held"][0]["state"] == "held"


def test_default_commit_drops_and_rollback_drops(ovl, home, target, upstream, tmp_path):
    sid = proxy_session(ovl, home, target)
    write_held(home, sid, 1, f"http://127.0.0.1:{upstream.port}/1")
    write_held(home, sid, 2, f"http://127.0.0.1:{upstream.port}/2")
    proc = ovl("commit", sid, check=0)
    assert "dropped 2 held requests: h0001, h0002" in proc.out and upstream.got == []
    [drop] = audit_lines(home, "egress.drop")
    assert (drop["sid"], drop["ids"]) == (sid, ["h0001", "h0002"])
    held = json.loads(ovl("egress", sid, "--json", check=0).out)["held"]
    assert [h["state"] for h in held] == ["dropped", "dropped"]

    other = tmp_path / "other"
    other.mkdir()
    sid2 = proxy_session(ovl, home, other)
    write_held(home, sid2, 1, f"http://127.0.0.1:{upstream.port}/3")
    proc = ovl("rollback", sid2, check=0)
    assert proc.out == f"rolled back {sid2}\ndropped 1 held request: h0001\n"
    assert upstream.got == []
    assert [(a["sid"], a["ids"]) for a in audit_lines(home, "egress.drop")][-1] == (sid2, ["h0001"])
    shown = json.loads(ovl("audit", "show", "--json", check=0).out)
    assert "egress.drop" in json.dumps(shown)


def test_release_failure_is_recorded_and_escaped(ovl, home, target):
    """A held request whose upstream is gone: the commit stands, the release line says it
    failed, the audit act carries the error."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                      # nothing listens there now
    sid = proxy_session(ovl, home, target)
    write_held(home, sid, 1, f"http://127.0.0.1:{port}/x")
    proc = ovl("commit", sid, "--release-held", check=0)
    assert (target / "new.txt").exists()
    assert "released h0001" in proc.out and "failed:" in proc.out
    [act] = audit_lines(home, "egress.release")
    assert act["status"] is None and act["error"]


def test_release_refuses_a_host_outside_the_allowlist(ovl, home, target, upstream):
    sid = proxy_session(ovl, home, target, allow=("example.org",))
    write_held(home, sid, 1, f"http://127.0.0.1:{upstream.port}/x")
    proc = ovl("commit", sid, "--release-held", check=0)
    assert upstream.got == [] and "failed:" in proc.out
    [act] = audit_lines(home, "egress.release")
    assert act["status"] is None and act["error"]


# -- end to end: a real --net proxy session -------------------------------------------------------

def test_end_to_end_curl_through_the_proxy(home, target, upstream):
    require_backend("kernel")
    require_tool("curl")
    ovl = Ovl(home, "kernel")
    url = f"http://127.0.0.1:{upstream.port}"
    sid, proc = ovl.run(target, "sh", "-c",
                        f"curl -sS {url}/get > got.txt; curl -sS -X POST -d hi {url}/post",
                        flags=["--jail", "--net", "proxy", "--net-allow", "127.0.0.1",
                               "--hold-writes"], check=None)
    assert sid, proc.err
    assert [(m, p) for m, p, _h, _b in upstream.got] == [("GET", "/get")]    # the POST is held
    data = json.loads(ovl("egress", sid, "--json", check=0).out)
    got = [(c["method"], c["path"], c["status"]) for c in data["connections"]]
    assert got == [("GET", "/get", 200), ("POST", "/post", 202)], data["connections"]
    [held] = data["held"]
    assert (held["method"], held["state"]) == ("POST", "held")
    assert "1 held request waits" in ovl("diff", sid, check=0).err
    proc = ovl("commit", sid, "--release-held", check=0)
    assert [(m, p, b) for m, p, _h, b in upstream.got][-1] == ("POST", "/post", b"hi")
    assert f"released {held['id']}" in proc.out and "-> 201" in proc.out
    assert (target / "got.txt").read_text() == "ok\n"
