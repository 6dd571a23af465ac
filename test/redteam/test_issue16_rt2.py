"""Red team 2, issue 16: where the first red team did not look. The replay writer of
`overlord import FILE -t DIR` fed a crafted (unverified) bundle, the memory an import takes,
and gc racing a running session. Holes are strict xfails naming the fix; defences that hold
are plain tests. Runs as root and as an ordinary user."""
import gzip
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import SESSION_RE, Ovl, state_of, tree
from test_issue16_bundle import add_file, members_of, pending_bundle, rewrite, two  # noqa: F401


def add_link(ms, name, link):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, link, 0o777
    ms[name] = [ti, None]


def pending_of(o):
    return [ln.split()[0] for ln in o("sessions").out.splitlines() if " pending " in ln]


def escapes(root):
    """Every symlink under root whose resolution leaves root."""
    real = os.path.realpath(root)
    out = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            if os.path.islink(p):
                r = os.path.realpath(p)
                if r != real and not r.startswith(real + os.sep):
                    out.append((os.path.relpath(p, root), os.readlink(p), r))
    return out


# -- holes ---------------------------------------------------------------------------------------

def test_a_chain_of_bundle_symlinks_points_outside_the_folder(two, target, tmp_path):
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "mkdir a; echo x > a/f")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        add_link(ms, "changes/tree/a/up", "..")          # the folder itself: inside
        add_link(ms, "changes/tree/a/out", "up/..")       # textually a/, really the parent
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir()
    proc = b("import", evil, "-t", t2)
    if proc.returncode == 0:
        pend = pending_of(b)
        assert len(pend) == 1
        b("commit", pend[0])
    assert escapes(t2) == []


def test_a_million_deletions_do_not_exhaust_memory(two, target, tmp_path):
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"
    deleted = ["d%d" % i for i in range(3_000_000)]

    def edit(ms):
        doc = json.loads(ms["changes/changes.json"][1])
        doc["deleted"] = deleted
        ms["changes/changes.json"][1] = json.dumps(doc).encode()
    rewrite(path, evil, edit)
    assert os.path.getsize(evil) < 20 << 20
    t2 = tmp_path / "t2"
    t2.mkdir()
    limit = 600 << 20                           # the importer given 600 MB of address space

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    proc = subprocess.run([sys.executable, "-m", "overlord", "import", str(evil), "-t", str(t2)],
                          env=b.env(), capture_output=True, timeout=300, preexec_fn=cap)
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "MemoryError" not in err, err[-2000:]
    assert proc.returncode == 1 and err.startswith("overlord: "), (proc.returncode, err[-2000:])


# -- defences that hold --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["a\x00b.txt", "sub/\x00", "x" * 300])
def test_unwritable_tree_names_fail_clean_and_leave_nothing(two, target, tmp_path, bad):
    """A NUL inside a pax name, a component over NAME_MAX: the import fails with one line, no
    record, no pending session, the folder untouched."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: add_file(ms, "changes/tree/" + bad, b"planted\n"))
    t2 = tmp_path / "t2"
    t2.mkdir()
    (t2 / "keep").write_text("mine\n")
    snap = tree(t2)
    proc = b("import", evil, "-t", t2)
    assert proc.returncode == 1 and "Traceback" not in proc.err, (proc.out, proc.err)
    assert tree(t2) == snap
    assert pending_of(b) == []
    assert not os.path.exists(b.home / "sessions" / sid)


def test_a_newline_in_a_name_lands_as_that_name_and_diff_shows_it_escaped(two, target, tmp_path):
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: add_file(ms, "changes/tree/evil\nA  b.txt", b"n\n"))
    t2 = tmp_path / "t2"
    t2.mkdir()
    b("import", evil, "-t", t2, check=0)
    pend = pending_of(b)
    assert len(pend) == 1
    out = b("diff", pend[0], check=0).out
    assert "\nA  b.txt" not in out, out               # no forged diff line
    b("commit", pend[0], check=0)
    assert sorted(os.listdir(t2)) == ["a.txt", "evil\nA  b.txt"]


def test_deep_tree_commits_whole_or_not_at_all(two, target, tmp_path):
    """A path longer than PATH_MAX (each part short): the writer walks by dir fd; commit then
    lands it whole or refuses with nothing half-written."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"
    deep = "/".join(["d" * 50] * 100)                 # 5,099 bytes

    def edit(ms):
        add_file(ms, "changes/tree/zz/" + deep + "/f", b"deep\n")
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir()
    proc = b("import", evil, "-t", t2)
    if proc.returncode != 0:
        assert "Traceback" not in proc.err and os.listdir(t2) == [], proc.err
        return
    pend = pending_of(b)
    assert len(pend) == 1
    done = b("commit", pend[0])
    assert "Traceback" not in done.err, done.err
    if done.returncode == 0:
        fd = os.open(t2, os.O_RDONLY)
        try:
            for part in ["zz"] + deep.split("/"):
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nfd
            with open(os.open("f", os.O_RDONLY, dir_fd=fd), "rb") as f:
                assert f.read() == b"deep\n"
        finally:
            os.close(fd)
        assert (t2 / "a.txt").read_text() == "x\n"
    else:
        assert sorted(os.listdir(t2)) == [], os.listdir(t2)


@pytest.mark.parametrize("mode", [0o4755, 0o2775, 0o6777])
def test_a_privileged_root_mode_does_not_reach_the_folder(two, target, tmp_path, mode):
    """changes.json's root_mode with setuid/setgid: commit refuses it without
    --allow-privileged-modes."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        doc = json.loads(ms["changes/changes.json"][1])
        doc["root_mode"] = mode
        ms["changes/changes.json"][1] = json.dumps(doc).encode()
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir(mode=0o755)
    os.chmod(t2, 0o755)
    proc = b("import", evil, "-t", t2)
    if proc.returncode == 0:
        pend = pending_of(b)
        assert len(pend) == 1
        done = b("commit", pend[0])
        assert done.returncode == 1 and ("setuid" in done.err or "setgid" in done.err), \
            (done.out, done.err)
    assert os.stat(t2).st_mode & 0o7777 == 0o755
    assert os.listdir(t2) == []


def test_the_diff_is_what_commit_lands(two, target, tmp_path):
    """Dirs, a symlink, files with modes, a deletion and a replaced dir: after import -t the
    diff's entries are exactly what commit changes in the folder."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        ti = tarfile.TarInfo("changes/tree/d")
        ti.type, ti.mode = tarfile.DIRTYPE, 0o700
        ms["changes/tree/d"] = [ti, None]
        add_file(ms, "changes/tree/d/x.sh", b"#!/bin/sh\n", 0o755)
        add_link(ms, "changes/tree/d/l", "x.sh")
        doc = json.loads(ms["changes/changes.json"][1])
        doc["deleted"] = ["gone.txt", "absent.txt"]
        ms["changes/changes.json"][1] = json.dumps(doc).encode()
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir()
    (t2 / "gone.txt").write_text("bye\n")
    (t2 / "kept.txt").write_text("stay\n")
    b("import", evil, "-t", t2, check=0)
    pend = pending_of(b)
    assert len(pend) == 1
    shown = b.diff(pend[0])
    before = tree(t2)
    b("commit", pend[0], check=0)
    after = tree(t2)
    changed = sorted(set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]})
    files = sorted(p for _, p in shown if os.path.islink(t2 / p) or not os.path.isdir(t2 / p))
    assert files == changed, (shown, changed)
    assert os.stat(t2 / "d").st_mode & 0o7777 == 0o700


# -- gc racing work ------------------------------------------------------------------------------

def _wait(cond, what, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_gc_while_a_command_runs_leaves_the_session_whole(ovl, target, tmp_path):
    """A session whose command is still running (state running) with a finished session
    beside it: `gc --keep-days 0 --keep-last 0` spares the running one, its layer and its
    lock; the command finishes, the session is pending with its change and commits."""
    old, _ = ovl.sh(target, "echo old > old.txt")
    ovl("commit", old, check=0)
    go = tmp_path / "go"
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "overlord", "run", "-t", str(target), "--", "sh", "-c",
         f"echo new > new.txt; : > {started}; while [ ! -e {go} ]; do sleep 0.02; done"],
        env=ovl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(started.exists, "the command to start")

        def running():
            out = json.loads(ovl("sessions", "--json", check=0).out)
            rows = out if isinstance(out, list) else out.get("sessions", [])
            return [r for r in rows if r.get("state") == "running"]
        sid = _wait(running, "a running session")[0]["sid"]
        gc = ovl("gc", "--keep-days", "0", "--keep-last", "0", "--json")
        assert gc.returncode == 0, gc.err
        assert sid not in gc.out
        go.write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert state_of(ovl, sid) == "pending"
    assert ovl.diff(sid) == [("added", "new.txt")]
    ovl("commit", sid, check=0)
    assert (target / "new.txt").read_text() == "new\n"


# -- budgets through the daemon ------------------------------------------------------------------

def _daemon_cls():
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "rt2_daemon_conftest", os.path.join(here, "..", "daemon", "conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Daemon


@pytest.fixture
def daemon(home):
    d = _daemon_cls()(home, os.path.join(home, "overlordd.sock"), None)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_a_brokered_agent_stops_at_the_machine_line_and_cannot_name_an_owner(daemon, home, target, tmp_path):
    """`cost budget --day-usd 0`: the daemon's agent op stops before its first call, reason
    budget, no ledger line; a harness that passes owner / meter / budget is refused (400; a null
    argument counts as absent),
    never run under another account's lines or none."""
    o = Ovl(home)
    o("cost", "budget", "--day-usd", "0", check=0)
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]))
    ask = {"id": 1, "op": "agent", "task": "hi", "target": str(target), "provider": "scripted",
           "script": str(script)}
    daemon.allow(target)
    for extra in ({"owner": "nobody"}, {"meter": 0}, {"budget": False}, {"session_tokens": 1000000}):
        bad = daemon.request(dict(ask, **extra))
        assert bad["ok"] is False and bad["code"] == 400, (extra, bad)
    done = daemon.request(ask)
    assert done["ok"] is True and done["reason"] == "budget", done
    assert not os.path.exists(home / "ledger.jsonl") or \
        [ln for ln in open(home / "ledger.jsonl") if ln.strip()] == []


# -- the vault and a jailed command --------------------------------------------------------------

@pytest.mark.parametrize("jail", [True, False])
def test_a_sandboxed_command_gets_no_resolved_or_provider_key(home, target, tmp_path, jail):
    """A resolver configured, a provider key in overlord's environment and one resolved from
    the vault (`secrets test` ran it): the command -- jailed or not -- finds neither value in
    its environment, in any /proc/*/environ it can read, nor (jailed) secrets.json or the
    resolver. (Both run in a pid namespace of their own: the overlord process is not in /proc.)"""
    from conftest import require_backend
    require_backend("kernel")
    o = Ovl(home, "kernel")
    value = "VAULT-VALUE-" + os.urandom(6).hex()
    envkey = "ENV-KEY-" + os.urandom(6).hex()
    resolver = tmp_path / "resolver.sh"
    resolver.write_text(f"#!/bin/sh\necho {value}\n")
    resolver.chmod(0o700)
    o("secrets", "set-command", f"{resolver} {{name}}", check=0)
    assert o("secrets", "test", "providers/anthropic", check=0).returncode == 0
    probe = (f"env; for p in /proc/[0-9]*; do cat $p/environ 2>/dev/null | tr '\\0' '\\n'; done; "
             f"cat {home}/secrets.json 2>&1; {resolver} x 2>&1; true")
    flags = ("--jail", "--net", "none") if jail else ()
    proc = o("run", "-t", target, *flags, "--", "sh", "-c", probe,
             env={"ANTHROPIC_API_KEY": envkey, "OPENAI_API_KEY": envkey})
    assert proc.returncode == 0, proc.err
    seen = proc.out + proc.err
    assert envkey not in seen, seen[-3000:]          # neither its env nor any /proc environ
    if jail:                                          # unjailed, the resolver file is in reach
        assert value not in seen, seen[-3000:]


@pytest.mark.parametrize("bad", ["..", "/etc/passwd", "a/../../b", "", ".", "a//b", 7])
def test_a_deleted_entry_outside_the_folder_is_refused(two, target, tmp_path, bad):
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        doc = json.loads(ms["changes/changes.json"][1])
        doc["deleted"] = [bad]
        ms["changes/changes.json"][1] = json.dumps(doc).encode()
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    (t2 / "b").mkdir(parents=True)
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "b" / "keep").write_text("outside\n")
    proc = b("import", evil, "-t", t2)
    assert proc.returncode == 1 and "Traceback" not in proc.err, (proc.out, proc.err)
    assert (tmp_path / "b" / "keep").exists() and os.path.isdir(t2 / "b")
    assert not os.path.exists(b.home / "sessions" / sid)


# -- what a '*' webhook carries off the machine --------------------------------------------------

from test_issue16_notify import FAST, recv  # noqa: E402,F401


def test_a_star_hook_does_not_carry_an_env_value_or_a_header_value(home, recv):
    """connector.config names env and header keys, never their values."""
    o = Ovl(home)
    r = recv()
    o("webhooks", "add", "all", f"http://127.0.0.1:{r.port}/h", "--format", "json", "--on", "*",
      "--allow-private", env=FAST, check=0)
    o("mcp", "add", "srv", "--command", "/bin/true", "--env", "TOKEN=ENV-SECRET-1",
      env=FAST, check=0)
    o("mcp", "add", "web", "--url", "https://example.com/mcp", "--header",
      "Authorization: Bearer HDR-SECRET-2", env=FAST, check=0)
    got = _wait(lambda: sum(b"connector.config" in body for _, _, body in r.requests) >= 2,
                "two connector.config deliveries")
    assert got
    bodies = b"".join(body for _, _, body in r.requests)
    assert b"ENV-SECRET-1" not in bodies and b"HDR-SECRET-2" not in bodies


def test_a_star_hook_does_not_carry_a_connectors_argv_secret(home, recv):
    o = Ovl(home)
    r = recv()
    o("webhooks", "add", "all", f"http://127.0.0.1:{r.port}/h", "--format", "json", "--on", "*",
      "--allow-private", env=FAST, check=0)
    o("mcp", "add", "srv", "--command", "/usr/bin/some-mcp", "--arg", "--api-key",
      "--arg", "ARG-SECRET-3", env=FAST, check=0)
    _wait(lambda: any(b"connector.config" in body for _, _, body in r.requests),
          "the connector.config delivery")
    bodies = b"".join(body for _, _, body in r.requests)
    assert b"ARG-SECRET-3" not in bodies


def test_a_root_mode_change_is_in_the_diff_before_commit_lands_it(two, target, tmp_path):
    """changes.json's root_mode 0777 (no privileged bit): the diff names it (`.` mode 0755 ->
    0777) before commit applies it -- nothing lands that review did not show."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        doc = json.loads(ms["changes/changes.json"][1])
        doc["root_mode"] = 0o777
        ms["changes/changes.json"][1] = json.dumps(doc).encode()
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir()
    os.chmod(t2, 0o755)
    b("import", evil, "-t", t2, check=0)
    pend = pending_of(b)
    assert len(pend) == 1
    words = b.diff_words(pend[0])
    assert ("modified", ".", "mode 0755 -> 0777") in words, words
