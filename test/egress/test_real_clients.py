"""Real clients through the recorded-egress proxy (issue 17, item 4).

pip, npm, curl and git run inside `overlord run --jail --net proxy --net-allow 127.0.0.1`
sessions on the kernel backend; the package index, registry, git server and files they fetch
are served by indexlib on 127.0.0.1 in the HOST network namespace (loopback is non-public, so
the allowlist names it exactly). Nothing goes to the internet. For each client: the command
succeeds, what it fetched is right (and lands in the session's changes), every request the
server saw is a line on the session's egress log (host, port, method, path, status, bytes),
and the egress log has no line the server did not see. A host outside the allowlist is refused
by the proxy (403, allowed: false) and the server never sees it; a client told to go direct
(NO_PROXY) fails, so the clients really go through the proxy.
"""
import hashlib
import json
import os
import shlex
import subprocess
import time

import pytest

from conftest import Ovl, require_backend, require_tool
from indexlib import Index

PIP = "/usr/bin/python3"
WHEEL_NAME, WHEEL_VERSION = "ovl-egress-demo", "1.0"
NPM_NAME, NPM_VERSION = "ovl-egress-npm", "1.0.0"
FILE_BODY = "a plain file for curl\n" * 50
HEADER_SLACK = 64 * 1024           # what a response's status line and headers may add


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    require_tool("git")
    ix = Index(str(tmp_path_factory.mktemp("index"))).start()
    try:
        ix.wheel = ix.add_pypi(WHEEL_NAME, WHEEL_VERSION)
        ix.npm = ix.add_npm(NPM_NAME, NPM_VERSION)
        ix.git_head = ix.add_git("repo", {"README": "served over dumb HTTP\n",
                                          "src/main.txt": "the main file\n"})
        ix.add("/file.txt", FILE_BODY, "text/plain")
        yield ix
    finally:
        ix.stop()


@pytest.fixture
def jailed(home, target):
    require_backend("kernel")
    return Jailed(Ovl(home, "kernel"), target)


class Jailed:
    """`overlord run --jail --net proxy --net-allow 127.0.0.1 -t target -- sh -c SCRIPT`."""

    def __init__(self, ovl, target):
        self.ovl, self.target = ovl, target

    def sh(self, script, allow=("127.0.0.1",), check=0):
        flags = ["--jail", "--net", "proxy"]
        for host in allow:
            flags += ["--net-allow", host]
        started = time.time()
        sid, proc = self.ovl.sh(self.target, script, flags=flags, check=check, timeout=180)
        assert sid, (proc.returncode, proc.out, proc.err)
        proc.window = (started, time.time())
        proc.out = "".join(l for l in proc.out.splitlines(True) if not l.startswith(f"session {sid} "))
        return sid, proc

    def egress(self, sid):
        """The session's egress lines, as the proxy wrote them (egress.jsonl in the session
        directory; `overlord egress --json` is test_egress_cli's)."""
        path = self.ovl.home / "sessions" / sid / "egress.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def commit(self, sid):
        self.ovl("commit", sid, check=0)


def require_pip():
    proc = subprocess.run([PIP, "-m", "pip", "--version"], capture_output=True)
    if proc.returncode != 0:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"{PIP} -m pip is not installed on a host that must have it")
        pytest.skip(f"{PIP} -m pip is not installed")


def ours(lines, index):
    return [line for line in lines if line["host"] == "127.0.0.1" and line["port"] == index.port]


def assert_every_request_logged(lines, hits, index, window):
    """Every hit the server saw is one egress line (same method, path with query, status,
    the body's bytes down) and every line for the server's address is one of the hits."""
    mine = ours(lines, index)
    assert len(mine) == len(hits), (hits, mine)
    left = list(mine)
    for hit in hits:
        found = [l for l in left if (l["method"], l["path"], l["status"]) ==
                 (hit.method, hit.path, hit.status)]
        assert found, (hit, left)
        line = found[0]
        left.remove(line)
        assert line["allowed"] is True and line["reason"] is None and line["held"] is None, line
        assert hit.bytes <= line["bytes_down"] <= hit.bytes + HEADER_SLACK, (hit, line)
        assert line["bytes_up"] == 0, line                  # GET: no request body
        assert isinstance(line["duration_ms"], (int, float)) and line["duration_ms"] >= 0, line
        assert window[0] - 1 <= line["ts"] <= window[1] + 1, (window, line)
        assert line["layer"] == 0 and isinstance(line["cause"], str) and line["cause"], line


def assert_headers_forwarded(hits, agent):
    """The upstream saw the client's own User-Agent and no Proxy-* header."""
    for hit in hits:
        names = {k.lower(): v for k, v in hit.headers}
        assert names.get("user-agent", "").lower().startswith(agent), (hit, hit.headers)
        assert not any(k.startswith("proxy-") for k in names), (hit, hit.headers)


def test_pip_download_through_the_proxy(jailed, index):
    require_pip()
    filename, data, digest = index.wheel
    mark = index.mark()
    sid, proc = jailed.sh(
        f"{PIP} -m pip --isolated download --no-deps --no-cache-dir --disable-pip-version-check "
        f"--index-url {index.url}/simple/ -d dl {WHEEL_NAME} && sha256sum dl/{filename}")
    assert f"Saved ./dl/{filename}" in proc.out and digest in proc.out, proc.out
    hits = index.since(mark)
    assert [(h.method, h.path, h.status) for h in hits] == [
        ("GET", f"/simple/{WHEEL_NAME}/", 200), ("GET", f"/files/{filename}", 200)], hits
    assert_every_request_logged(jailed.egress(sid), hits, index, proc.window)
    assert_headers_forwarded(hits, "pip/")
    assert ("added", f"dl/{filename}") in jailed.ovl.diff(sid)
    jailed.commit(sid)
    assert (jailed.target / "dl" / filename).read_bytes() == data


def test_npm_view_and_pack_through_the_proxy(jailed, index):
    require_tool("npm")
    filename, data = index.npm
    npm = f"npm --registry {index.url}/ --cache /tmp/npmcache --no-update-notifier"
    mark = index.mark()
    sid, proc = jailed.sh(f"{npm} view {NPM_NAME} version && {npm} pack {NPM_NAME}")
    assert proc.out.split()[:2] == [NPM_VERSION, filename], proc.out
    hits = index.since(mark)
    assert {(h.method, h.path, h.status) for h in hits} == {
        ("GET", f"/{NPM_NAME}", 200), ("GET", f"/{NPM_NAME}/-/{filename}", 200)}, hits
    assert_every_request_logged(jailed.egress(sid), hits, index, proc.window)
    assert_headers_forwarded(hits, "npm/")
    assert ("added", filename) in jailed.ovl.diff(sid)
    jailed.commit(sid)
    assert (jailed.target / filename).read_bytes() == data


def test_curl_through_the_proxy(jailed, index):
    require_tool("curl")
    mark = index.mark()
    sid, proc = jailed.sh(f"curl -sS -o got.txt {index.url}/file.txt && "
                          f"curl -sS {index.url}/missing.txt")
    assert proc.out == "not found\n", proc.out
    hits = index.since(mark)
    assert [(h.method, h.path, h.status) for h in hits] == [
        ("GET", "/file.txt", 200), ("GET", "/missing.txt", 404)], hits
    assert_every_request_logged(jailed.egress(sid), hits, index, proc.window)
    assert_headers_forwarded(hits, "curl/")
    assert jailed.ovl.diff(sid) == [("added", "got.txt")]
    jailed.commit(sid)
    assert (jailed.target / "got.txt").read_text() == FILE_BODY


def test_curl_tunnel_is_one_connect_line(jailed, index):
    """`curl -p` tunnels plain HTTP through CONNECT: the line says CONNECT, no path, 200, and
    the bytes each way of the tunnel (the server's whole answer went down it)."""
    require_tool("curl")
    mark = index.mark()
    sid, proc = jailed.sh(f"curl -sS -p -o got.txt {index.url}/file.txt")
    hits = index.since(mark)
    assert [(h.method, h.path, h.status) for h in hits] == [("GET", "/file.txt", 200)], hits
    mine = ours(jailed.egress(sid), index)
    assert len(mine) == 1, mine
    line = mine[0]
    assert (line["method"], line["path"], line["status"], line["allowed"]) == \
        ("CONNECT", None, 200, True), line
    assert len(FILE_BODY) < line["bytes_down"] <= len(FILE_BODY) + HEADER_SLACK, line
    assert line["bytes_up"] > len("GET /file.txt HTTP/1.1\r\n"), line
    jailed.commit(sid)
    assert (jailed.target / "got.txt").read_text() == FILE_BODY


def test_git_clone_through_the_proxy(jailed, index):
    require_tool("git")
    mark = index.mark()
    sid, proc = jailed.sh(f"GIT_TERMINAL_PROMPT=0 git clone -q {index.url}/repo.git clone && "
                          "git -C clone rev-parse HEAD && cat clone/src/main.txt")
    assert proc.out.split("\n")[:2] == [index.git_head, "the main file"], proc.out
    hits = index.since(mark)
    paths = [h.path for h in hits]
    assert paths[0] == "/repo.git/info/refs?service=git-upload-pack", paths
    assert "/repo.git/HEAD" in paths and all(h.status == 200 for h in hits), hits
    assert sum(p.startswith("/repo.git/objects/") for p in paths) >= 4, paths   # commit, 2 trees, 2 blobs
    assert_every_request_logged(jailed.egress(sid), hits, index, proc.window)
    assert_headers_forwarded(hits, "git/")
    changes = jailed.ovl.diff(sid)
    assert ("added", "clone/README") in changes and ("added", "clone/src/main.txt") in changes
    jailed.commit(sid)
    assert (jailed.target / "clone" / "README").read_text() == "served over dumb HTTP\n"


@pytest.mark.parametrize("host", ["localhost", "disallowed.example", "127.0.0.2"])
def test_a_host_outside_the_allowlist_is_refused(jailed, index, host):
    """localhost and 127.0.0.2 both reach the server's port if let through; neither is named,
    so the proxy refuses them (403 with a one-line reason) and the server sees nothing."""
    require_tool("curl")
    mark = index.mark()
    url = f"http://{host}:{index.port}/file.txt"
    sid, proc = jailed.sh(f"curl -sS -o refused.txt -w '%{{http_code}}\\n' {shlex.quote(url)}")
    assert proc.out == "403\n", proc.out
    assert index.since(mark) == []
    lines = jailed.egress(sid)
    refused = [l for l in lines if l["host"] == host]
    assert len(refused) == 1 and len(lines) == 1, lines
    line = refused[0]
    assert (line["port"], line["method"], line["path"], line["allowed"], line["status"]) == \
        (index.port, "GET", "/file.txt", False, 403), line
    assert isinstance(line["reason"], str) and line["reason"] and "\n" not in line["reason"], line
    jailed.commit(sid)
    text = (jailed.target / "refused.txt").read_text()
    assert text.count("\n") <= 1 and text.strip(), text           # a one-line reason


def test_the_direct_path_is_dead(jailed, index):
    """Told to bypass the proxy for 127.0.0.1, each client fails: 127.0.0.1 inside the
    session's network namespace is its own loopback, where the server is not."""
    require_tool("curl")
    require_tool("git")
    require_pip()
    direct = "NO_PROXY=127.0.0.1 no_proxy=127.0.0.1"
    mark = index.mark()
    sid, proc = jailed.sh(
        f"{direct} curl -sS -o direct.txt {index.url}/file.txt; echo curl=$?; "
        f"{direct} GIT_TERMINAL_PROMPT=0 git clone -q {index.url}/repo.git direct-clone; echo git=$?; "
        f"{direct} {PIP} -m pip --isolated download --no-deps --no-cache-dir "
        "--disable-pip-version-check --retries 0 --timeout 5 "
        f"--index-url {index.url}/simple/ -d direct-dl {WHEEL_NAME}; echo pip=$?; "
        f"curl -sS -o via-proxy.txt {index.url}/file.txt; echo proxied=$?")
    codes = dict(line.split("=", 1) for line in proc.out.splitlines() if "=" in line)
    assert codes["curl"] == "7", proc.out                     # couldn't connect
    assert codes["git"] != "0" and codes["pip"] != "0", proc.out
    assert codes["proxied"] == "0", (proc.out, proc.err)
    hits = index.since(mark)
    assert [(h.method, h.path) for h in hits] == [("GET", "/file.txt")], hits
    assert_every_request_logged(jailed.egress(sid), hits, index, proc.window)
    changes = dict((path, kind) for kind, path in jailed.ovl.diff(sid))
    assert "via-proxy.txt" in changes and "direct.txt" not in changes
    assert not any(p.startswith(("direct-clone/", "direct-dl/")) for p in changes), changes
