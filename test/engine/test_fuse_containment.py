"""The fuse backend keeps OVERLORD_HOME out of a command's reach where the host allows a private
mount namespace: the merged view bound over the target's own path, a tmpfs over OVERLORD_HOME,
a /proc of the command's own PID namespace. Where the host refuses, the command runs as before
and the caveat says so."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SESSION_RE, Ovl, require_backend, tree

PY = sys.executable
ROOT = os.geteuid() == 0


@contextlib.contextmanager
def spy():
    """A same-uid host process holding no capabilities (as another session's command does):
    the kernel lets a capability-free command of the same uid follow its /proc/PID/root."""
    proc = subprocess.Popen([PY, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                             "from overlord.linux import libc; libc.capset_zero(); "
                             "print('ready', flush=True); time.sleep(120)", REPO],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def require_hidden():
    """The namespaces exist on this host (else skip; CI, which must have them, fails)."""
    require_backend("fuse")
    from overlord.sandbox import fuse
    level, why = fuse.containment()
    if level != fuse.HIDDEN:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"the fuse backend cannot hide OVERLORD_HOME on a host that must: {why}")
        pytest.skip(f"the fuse backend cannot hide OVERLORD_HOME here: {why}")


@pytest.fixture
def fovl(home):
    require_hidden()
    return Ovl(home, "fuse")


ATTACK = r'''
import json, os, sys
home, other, own, spy = sys.argv[1:5]
out = {}
def attempt(name, fn):
    try:
        r = fn()
        out[name] = "OK" if r is None else r
    except OSError as e:
        out[name] = e.__class__.__name__
def write(path, text="planted\n"):
    with open(path, "a") as f:
        f.write(text)
def read(path):
    with open(path, "rb") as f:
        return "READ:" + f.read().decode(errors="replace")
attempt("ls home", lambda: sorted(os.listdir(home)))
attempt("backdoor", lambda: write(f"{home}/sessions/{other}/layers/0000/backdoor.py"))
attempt("other meta", lambda: write(f"{home}/sessions/{other}/meta.json", " "))
attempt("keys", lambda: read(f"{home}/keys.json"))
attempt("own upper", lambda: write(f"{home}/sessions/{own}/upper/behind-the-back.txt"))
attempt("own meta", lambda: write(f"{home}/sessions/{own}/meta.json", " "))
# through /proc: the starter (PID 1 here), and a same-uid host process by its host pid
attempt("proc 1 root", lambda: read(f"/proc/1/root{home}/keys.json"))
attempt("proc 1 cwd", lambda: os.listdir("/proc/1/cwd"))
attempt("spy root", lambda: read(f"/proc/{spy}/root{home}/keys.json"))
leaks = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for link in ("root", "cwd"):
            try:
                os.stat(f"/proc/{pid}/{link}{home}/keys.json")
                leaks.append(f"{pid}/{link}")
            except OSError:
                pass
out["proc leaks"] = leaks
out["cwd"] = os.getcwd()
# .. from the cwd and from every inherited fd
out["fds"] = sorted(os.listdir("/proc/self/fd"))
attempt("dotdot", lambda: read(os.path.join(os.getcwd(), *[".."] * 12) + home + "/keys.json"))
print("RT:" + json.dumps(out))
'''


def rt(proc):
    rows = [l[3:] for l in proc.out.splitlines() if l.startswith("RT:")]
    assert rows, (proc.returncode, proc.out, proc.err)
    return json.loads(rows[-1])


def test_a_fuse_command_cannot_see_or_alter_overlord_home(fovl, home, target, tmp_path):
    other_target = tmp_path / "other"
    other_target.mkdir()
    other, _ = fovl.sh(other_target, "echo mine > mine.txt")
    keys = home / "keys.json"
    keys.write_text('{"anthropic": "sk-operator-secret"}\n')
    os.chmod(keys, 0o600)
    sessions = home / "sessions"
    before = {"other": tree(sessions / other), "keys": keys.read_bytes(),
              "diff": fovl.diff(other)}
    own, _ = fovl.run(target, "touch", "opened")
    with spy() as pid:
        proc = fovl("exec", own, "--", PY, "-c", ATTACK, str(home), other, own, pid,
                    cwd=str(target), check=0)
    out = rt(proc)
    assert out["ls home"] in ("PermissionError", []), out
    for name in ("backdoor", "other meta", "keys", "own upper", "own meta", "proc 1 root",
                 "proc 1 cwd", "spy root", "dotdot"):
        assert out[name] in ("PermissionError", "FileNotFoundError", "NotADirectoryError"), (name, out)
    assert out["proc leaks"] == [], out
    assert out["cwd"] == str(target)
    assert out["fds"] == ["0", "1", "2", "3"], out    # 3: the listdir's own descriptor
    assert not (sessions / other / "layers" / "0000" / "backdoor.py").exists()
    assert tree(sessions / other) == before["other"]
    assert keys.read_bytes() == before["keys"]
    assert fovl.diff(other) == before["diff"] == [("added", "mine.txt")]
    assert fovl.diff(own) == [("added", "opened")]   # nothing written behind fuse-overlayfs


def test_the_controls_the_attack_would_succeed_without_the_namespace(home, target):
    """Positive control: the same probes, run on the host as the same user, reach everything
    (so the refusals above are the namespace's doing, not a wrong path)."""
    require_backend("fuse")
    keys = home / "keys.json"
    keys.write_text("{}\n")
    (home / "sessions" / "x" / "layers" / "0000").mkdir(parents=True)
    (home / "sessions" / "x" / "meta.json").write_text("{}")
    (home / "sessions" / "y" / "upper").mkdir(parents=True)
    (home / "sessions" / "y" / "meta.json").write_text("{}")
    with spy() as pid:
        proc = subprocess.run([PY, "-c", ATTACK, str(home), "x", "y", str(pid)],
                              capture_output=True, text=True, cwd=str(target))
    proc.out = proc.stdout
    out = rt(proc)
    assert out["ls home"] == ["keys.json", "sessions"]
    for name in ("backdoor", "other meta", "own upper", "own meta"):
        assert out[name] == "OK", (name, out)
    assert out["keys"].startswith("READ:") and out["spy root"].startswith("READ:")
    assert out["proc leaks"] != []


def test_absolute_path_writes_to_the_target_are_captured(fovl, target, tmp_path):
    real = tree(target)
    t = str(target)
    sid, _ = fovl.sh(target, f"echo abs > {t}/abs.txt; echo more >> {t}/hello.txt; "
                             f"rm {t}/sub/a.txt; mkdir {t}/newdir", cwd=str(tmp_path))
    assert tree(target) == real                     # the real tree did not move
    assert fovl.diff(sid) == [("added", "abs.txt"), ("added", "newdir"), ("deleted", "sub/a.txt"),
                              ("modified", "hello.txt")]
    fovl("commit", sid, check=0)
    assert (target / "abs.txt").read_text() == "abs\n"
    assert (target / "hello.txt").read_text() == "hello\nmore\n"
    assert not (target / "sub" / "a.txt").exists()


def test_relative_paths_in_a_subdirectory_and_run_from_within_the_target(fovl, target):
    real = tree(target)
    sub = target / "sub"
    # `overlord run` from inside the target, no -t: the target is the cwd
    proc = fovl("run", "--", "sh", "-c", "pwd; cat a.txt; echo r > r.txt; echo up > ../up.txt",
                cwd=str(sub), check=0)
    assert proc.out.startswith(f"{sub}\na\n"), proc.out
    inner = SESSION_RE.search(proc.out).group(1)
    assert fovl.diff(inner) == [("added", "r.txt")]    # ../up.txt is outside this target
    (target / "up.txt").unlink()                        # (so it went to the host, as unjailed)
    fovl("rollback", inner, check=0)
    # -t the target, cwd in its subdirectory: the command starts there, at the real path
    sid, proc = fovl.sh(target, "pwd; cat a.txt; echo r > r.txt; echo up > ../up.txt", cwd=str(sub))
    assert proc.out.startswith(f"{sub}\na\n"), proc.out
    assert fovl.diff(sid) == [("added", "sub/r.txt"), ("added", "up.txt")]
    assert tree(target) == real
    # and exec later, from elsewhere, starts at the target's root
    proc = fovl("exec", sid, "--", "sh", "-c", "pwd; cat sub/r.txt up.txt", check=0)
    assert proc.out.startswith(f"{target}\nr\nup\n"), proc.out


def test_a_caller_cwd_inside_overlord_home_does_not_reach_the_command(fovl, home, target):
    sid, _ = fovl.run(target, "touch", "opened")
    where = home / "sessions" / sid
    proc = fovl("exec", sid, "--", "sh", "-c", "pwd; ls -a ..; cat ../meta.json; echo $?",
                cwd=str(where), check=0)
    assert proc.out.startswith(f"{target}\n"), proc.out
    assert "meta.json" not in proc.out.split("\n", 1)[1].replace("../meta.json", ""), proc.out


def test_a_directory_as_stdin_is_refused(fovl, home, target):
    from overlord import ops
    from overlord.errors import LaunchError
    sid, _ = fovl.run(target, "touch", "opened")
    fd = os.open(str(home), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(LaunchError, match="fd 0 is a directory"):
            ops.exec_in(sid, ["ls", "/proc/self/fd/0/"], stdio=(fd, None, None))
    finally:
        os.close(fd)
    assert fovl.diff(sid) == [("added", "opened")]


def test_doctor_and_the_caveat_say_overlord_home_is_hidden(fovl, home):
    from overlord.sandbox import fuse, kernel
    assert fuse.caveat({}) is None and kernel.caveat({}) is None
    proc = fovl("doctor", check=None)
    assert ("\nfuse containment: OVERLORD_HOME hidden from commands (private mount namespace"
            in proc.out), proc.out
    data = json.loads(fovl("doctor", "--json", check=None).out)
    assert data["fuse_containment"]["hidden"] is True
    assert data["fuse_containment"]["detail"].startswith("OVERLORD_HOME hidden from commands")


# -- where the host refuses the namespaces ---------------------------------------------------------

@pytest.fixture
def inproc(home, monkeypatch):
    require_backend("fuse")
    from overlord.sandbox import fuse
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "fuse")
    monkeypatch.setattr(fuse, "_last", None)
    monkeypatch.setattr(fuse, "_probed", None)
    return fuse


def test_without_namespaces_the_command_runs_as_before_and_the_caveat_warns(inproc, target,
                                                                           monkeypatch, home):
    from overlord import ops
    from overlord.linux import libc

    def refused(flags):
        raise OSError(1, "clone: Operation not permitted")
    monkeypatch.setattr(libc, "clone_namespaces", refused)
    sid = ops.run(["touch", "opened"], target=str(target), backend="fuse").sid
    cap = ops.exec_capture(sid, ["sh", "-c", "pwd; ls " + str(home / "sessions")])
    out = cap.stdout.decode()
    assert out.startswith(str(home / "sessions" / sid / "merged") + "\n"), out   # today's cwd
    assert sid in out                                  # and OVERLORD_HOME is in plain sight
    line = inproc.caveat({})
    assert line.startswith("fuse backend: a hostile command can read and alter OVERLORD's "
                           "records and the operator's keys") and "cooperative" in line, line
    assert "unshare" in line


def test_without_a_private_proc(inproc, target, monkeypatch, home):
    from overlord import ops
    from overlord.linux import libc
    real_mount = libc.mount

    def no_proc(source, target_, fstype, flags=0, data=None):
        if fstype == "proc":
            raise OSError(1, "mount: Operation not permitted", target_)
        return real_mount(source, target_, fstype, flags, data)
    monkeypatch.setattr(libc, "mount", no_proc)
    sid = ops.run(["touch", "opened"], target=str(target), backend="fuse").sid
    cap = ops.exec_capture(sid, ["sh", "-c", "pwd; ls -a " + str(home) + " | wc -l"])
    lines = cap.stdout.decode().split("\n")
    assert lines[0] == str(target)                     # still bound over the target
    assert lines[1] in ("0", "2"), lines               # and OVERLORD_HOME still hidden
    (home / "keys.json").write_text("operator-secret\n")
    with spy() as pid:
        cap = ops.exec_capture(sid, [PY, "-c", ATTACK, str(home), "x", sid, str(pid)])
    cap.out = cap.stdout.decode()
    out = rt(cap)
    assert out["keys"] == "PermissionError", out
    if ROOT:
        # the hole the caveat names is real: neither seccomp nor a non-dumpable starter
        # closes it, only a /proc of the command's own PID namespace
        assert out["spy root"] == "READ:operator-secret\n", out
        line = inproc.caveat({})
        assert "/proc" in line and "for cooperative programs only" in line, line
        assert inproc.containment()[0] == inproc.HOST_PROC
    else:
        # an ordinary user's command is in a user namespace of its own, where it holds no
        # capability over any process outside its tree: the host's /proc leads nowhere
        assert out["spy root"] == "PermissionError" and out["proc leaks"] == [], out
        assert inproc.caveat({}) is None
        assert inproc.containment()[0] == inproc.HIDDEN
