"""The Dockerfile, built and run without a container engine: its instructions carried out one
by one in a fresh Debian 13 root (test/packaging/rootfs.py) -- COPY honouring .dockerignore,
each RUN as `/bin/sh -c` as the current USER with exactly the accumulated ENV/ARG in the
current WORKDIR -- then, as the image's USER with its ENV, the header's first-run steps (the
certificate, the first admin with the password on stdin), `overlord doctor`, the CMD in the
background, the HEALTHCHECK against it, and the server stopped. An instruction this file does
not know fails the test (so the Dockerfile cannot grow one that is not checked here)."""
import fcntl
import json
import os
import re
import shlex
import shutil
import time

import pytest

import rootfs

REPO = rootfs.REPO
DOCKERFILE = os.path.join(REPO, "Dockerfile")
KNOWN = ("FROM", "ARG", "ENV", "WORKDIR", "COPY", "RUN", "USER", "VOLUME", "EXPOSE",
         "HEALTHCHECK", "CMD")
DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWORD = "correct horse battery staple"


# -- reading the Dockerfile -------------------------------------------------------------------------

def instructions(text):
    """[(lineno, INSTRUCTION, arguments)]: comment lines dropped (inside a continuation too,
    as Docker does), backslash continuations joined."""
    out, buf, start = [], [], None
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if start is None:
            start = no
        if line.rstrip().endswith("\\"):
            buf.append(line.rstrip()[:-1])
            continue
        buf.append(line)
        joined = " ".join(part.strip() for part in buf)
        word, _, rest = joined.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf, start = [], None
    assert not buf, "the Dockerfile ends inside a continuation"
    return out


def header(text):
    """The leading comment block, continuation lines joined (the build and run lines)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    joined, out = "", []
    for line in lines:
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        out.append(joined + line)
        joined = ""
    return out


def exec_form(args):
    """An exec-form (JSON array) argument, or None for the shell form."""
    if args.startswith("["):
        value = json.loads(args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
        return value
    return None


def key_values(args, what):
    """ENV/ARG pairs: `K=V ...` (shell-quoted) or the legacy `K V`."""
    words = shlex.split(args)
    if what == "ENV" and words and "=" not in words[0]:
        return [(words[0], args.split(None, 1)[1] if len(words) > 1 else "")]
    out = []
    for word in words:
        key, eq, value = word.partition("=")
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{what} {args}"
        out.append((key, value if eq else None))
    return out


def expand(value, env):
    """$VAR and ${VAR} from the build's variables (what Docker substitutes in ENV, WORKDIR,
    COPY, USER, ...; RUN's shell does its own)."""
    return re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))",
                  lambda m: env.get(m.group(1) or m.group(2), ""), value)


def ignore_patterns():
    path = os.path.join(REPO, ".dockerignore")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                neg = line.startswith("!")
                out.append((neg, os.path.normpath(line.lstrip("!").strip("/"))))
    return out


def _match(pattern, rel):
    """Docker's .dockerignore matching: `**` any number of directories, `*` within a name;
    a pattern matching a directory excludes what is under it."""
    rx = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern):
        if part.startswith("**"):
            rx += "(?:.*/)?" if part.endswith("/") else ".*"
        elif part == "*":
            rx += "[^/]*"
        elif part == "?":
            rx += "[^/]"
        else:
            rx += re.escape(part)
    return re.fullmatch(rx + "(?:/.*)?", rel) is not None


def ignored(rel, patterns):
    out = False
    for neg, pattern in patterns:
        if _match(pattern, rel):
            out = not neg
    return out


# -- carrying it out in a fresh root ----------------------------------------------------------------

# Every fresh root shares one archive of .debs (rootfs.apt_cache(), bind-mounted at
# /var/cache/apt/archives), and apt takes its lock without waiting: a RUN whose apt-get met
# another suite's apt there is run again (it failed before changing anything), after waiting
# on that very lock (apt's is a POSIX record lock: lockf here blocks until it is free).
APT_BUSY = "Could not get lock /var/cache/apt/archives/lock"


def wait_for_apt_archives():
    with open(os.path.join(rootfs.apt_cache(), "lock"), "a") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        fcntl.lockf(f, fcntl.LOCK_UN)


class Image:
    """What the instructions built: the root and the image's configuration."""

    def __init__(self, root):
        self.root = root
        self.base = None
        self.env = {"PATH": DOCKER_PATH}       # what every Docker image starts with
        self.args = {}
        self.user = "root"
        self.workdir = "/"
        self.volumes, self.exposed = [], []
        self.healthcheck = self.cmd = None
        self.log = []                             # (instruction, seconds)
        self.outputs = []                         # each RUN's stdout

    def home_of(self, user):
        with open(self.root.host("/etc/passwd"), encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if fields[0] == user or fields[2] == user:
                    return fields[5]
        return "/"

    def shell(self, argv, env=None, user=None, workdir=None):
        """A script for Root.run (as root) that runs `argv` as `user` (default the image's) with
        exactly `env` (default the image's, as Docker sets it: HOME from passwd unless ENV set
        it) in `workdir`: what a RUN step or a `docker run` of this image gets."""
        user = self.user if user is None else user
        env = dict(self.env if env is None else env)
        env.setdefault("HOME", self.home_of(user))
        cmd = ["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + list(argv)
        if user != "root":
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] + cmd
        return f"cd {shlex.quote(workdir or self.workdir)} && exec {shlex.join(cmd)}"

    def run_args(self, args):
        return exec_form(args) or ["/bin/sh", "-c", args]

    def build(self, text):
        for no, word, args in instructions(text):
            if word not in KNOWN:
                pytest.fail(f"Dockerfile:{no}: {word} is an instruction this test cannot carry "
                            f"out (it knows {', '.join(KNOWN)}): teach test_dockerfile.py first")
            started = time.monotonic()
            getattr(self, "do_" + word.lower())(no, args)
            self.log.append((f"{word} {args[:60]}", time.monotonic() - started))

    def do_from(self, no, args):
        assert self.base is None, f"Dockerfile:{no}: a second FROM (multi-stage) is not checked here"
        self.base = args
        assert re.fullmatch(r"debian:(trixie|13)(-slim|\.\d+(-slim)?)?", args), \
            f"Dockerfile:{no}: FROM {args} is not Debian 13 (trixie)"
        with open(self.root.host("/etc/os-release"), encoding="utf-8") as f:
            release = f.read()
        assert "VERSION_CODENAME=trixie" in release, "the fresh root is not Debian 13"

    def do_arg(self, no, args):
        for key, value in key_values(args, "ARG"):
            self.args[key] = "" if value is None else expand(value, {**self.args, **self.env})

    def do_env(self, no, args):
        for key, value in key_values(args, "ENV"):
            self.env[key] = expand(value or "", {**self.args, **self.env})

    def do_workdir(self, no, args):
        path = os.path.join(self.workdir, expand(args, {**self.args, **self.env}))
        if not os.path.isdir(self.root.host(path)):
            self.root.run(f"mkdir -p {shlex.quote(path)}")
        self.workdir = path

    def do_copy(self, no, args):
        words = shlex.split(args)
        assert not any(w.startswith("--") for w in words), f"Dockerfile:{no}: COPY flags are not checked here"
        assert len(words) >= 2, f"Dockerfile:{no}: COPY SRC... DEST"
        *sources, dest = [expand(w, {**self.args, **self.env}) for w in words]
        dest = os.path.join(self.workdir, dest)
        patterns = ignore_patterns()
        for src in sources:
            rel0 = os.path.normpath(src)
            assert not rel0.startswith(".."), f"Dockerfile:{no}: COPY from outside the context"
            top = os.path.join(REPO, rel0)
            assert os.path.exists(top) and (rel0 == "." or not ignored(rel0, patterns)), \
                f"Dockerfile:{no}: COPY {src}: not in the build context"
            if os.path.isfile(top):
                target = self.root.host(dest if not dest.endswith("/") else dest + os.path.basename(top))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(top, target)
                continue
            for base, dirs, files in os.walk(top):
                rel_base = os.path.relpath(base, REPO)
                keep = []
                for d in sorted(dirs):
                    rel = os.path.normpath(os.path.join(rel_base, d))
                    if os.path.islink(os.path.join(base, d)):
                        files.append(d)
                    elif not ignored(rel, patterns):
                        keep.append(d)
                dirs[:] = keep
                inside = os.path.join(dest, os.path.relpath(base, top))
                os.makedirs(self.root.host(inside), exist_ok=True)
                for name in files:
                    rel = os.path.normpath(os.path.join(rel_base, name))
                    if ignored(rel, patterns):
                        continue
                    src_path = os.path.join(base, name)
                    target = self.root.host(os.path.join(inside, name))
                    if os.path.islink(src_path):
                        os.symlink(os.readlink(src_path), target)
                    else:
                        shutil.copy2(src_path, target)
        # COPY's files belong to root (no --chown), whoever owns them in the checkout
        self.root.run(f"chown -R 0:0 {shlex.quote(dest)}")

    def do_run(self, no, args):
        env = {**{k: v for k, v in self.args.items() if k not in self.env}, **self.env}
        for attempt in range(10):
            wait_for_apt_archives()
            proc = self.root.run(self.shell(self.run_args(args), env=env), check=False)
            if not (proc.returncode and APT_BUSY in proc.stderr):
                break
        if proc.returncode:
            pytest.fail(f"Dockerfile:{no}: RUN failed (exit {proc.returncode}) as {self.user}:\n"
                        f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        self.outputs.append(proc.stdout)

    def do_user(self, no, args):
        user = expand(args, {**self.args, **self.env})
        assert ":" not in user, f"Dockerfile:{no}: USER with a group is not checked here"
        proc = self.root.run(f"id -u {shlex.quote(user)}", check=False)
        assert proc.returncode == 0, f"Dockerfile:{no}: USER {user}: no such user in the image"
        self.user = user

    def do_volume(self, no, args):
        self.volumes += exec_form(args) or args.split()

    def do_expose(self, no, args):
        self.exposed += args.split()

    def do_healthcheck(self, no, args):
        words = args.split()
        options = {}
        while words and words[0].startswith("--"):
            key, _, value = words.pop(0)[2:].partition("=")
            options[key] = value
        assert words and words[0].upper() == "CMD", f"Dockerfile:{no}: HEALTHCHECK CMD ... expected"
        rest = args.split(None, len(options) + 1)[-1]
        self.healthcheck = (options, self.run_args(rest))

    def do_cmd(self, no, args):
        self.cmd = self.run_args(args)


# -- the test ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image(tmp_path_factory):
    rootfs.require()
    started = time.monotonic()
    root = rootfs.fresh(tmp_path_factory.mktemp("docker"))
    img = Image(root)
    with open(DOCKERFILE, encoding="utf-8") as f:
        img.text = f.read()
    img.build(img.text)
    img.build_seconds = time.monotonic() - started
    return img


def test_the_instruction_reader_refuses_what_it_cannot_check(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text("VERSION_CODENAME=trixie\n")
    img = Image(rootfs.Root(str(tmp_path)))
    with pytest.raises(pytest.fail.Exception, match="ONBUILD is an instruction"):
        img.build("FROM debian:trixie-slim\nONBUILD RUN true\n")
    parsed = instructions("# c\nRUN a \\\n# inside\n  && b\nCMD [\"x\"]\n")
    assert parsed == [(2, "RUN", "a && b"), (5, "CMD", '["x"]')]
    patterns = [(False, "**/__pycache__"), (False, "test"), (False, "*.md"), (True, "README.md")]
    assert ignored("overlord/__pycache__/x.pyc", patterns) and ignored("__pycache__", patterns)
    assert ignored("test/unit/test_x.py", patterns) and not ignored("overlord/test.py", patterns)
    assert ignored("NOTES.md", patterns) and not ignored("README.md", patterns)
    with pytest.raises(AssertionError, match="not Debian 13"):
        Image(rootfs.Root(str(tmp_path))).do_from(1, "debian:bookworm-slim")


def test_the_image_is_built_as_the_dockerfile_says(image):
    """Every RUN step succeeded in the fresh root; what it leaves is what the image holds."""
    print(f"\nbuild in a fresh root: {image.build_seconds:.1f} s")
    for what, seconds in image.log:
        print(f"  {seconds:6.1f} s  {what}")
    for out in image.outputs:                 # install.sh's own lines (between apt's)
        said = out.split("deps: skipped (--no-deps)", 1)
        if len(said) == 2:
            print("install.sh --no-deps:\n  deps: skipped (--no-deps)"
                  + said[1].split("Reading package lists", 1)[0].rstrip().replace("\n", "\n  "))
    r = image.root
    assert image.base.startswith("debian:trixie")
    assert image.user == "overlord" and image.env.get("OVERLORD_HOME") == "/data"
    assert image.volumes == ["/data"] and image.exposed == ["7777"]
    st = os.stat(r.host("/data"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 10001, 0o700)
    assert r.run("id -u overlord").stdout.strip() == "10001"
    launcher = r.host("/usr/local/bin/overlord")
    with open(launcher, "rb") as f:
        assert f.read(4) == b"\x7fELF"                       # the compiled launcher
    assert os.stat(launcher).st_uid == 0
    assert os.path.exists(r.host("/usr/local/lib/overlord/install-manifest.json"))
    # build-only packages, the package lists, the checkout and the build's home are gone
    gone = r.run("command -v gcc cc; ls /var/lib/apt/lists | grep -v -e '^lock$' -e '^partial$';"
                 " ls -d /src /tmp/overlord-build 2>/dev/null; true").stdout.split()
    assert gone == [], gone
    assert os.readlink(r.host("/etc/mtab")) == "../proc/self/mounts"     # fusermount3 -u reads it
    assert os.listdir(r.host("/data")) == []                    # the volume starts empty
    for tool in ("python3", "fuse-overlayfs", "fusermount3", "strace", "git", "openssl"):
        r.run(f"command -v {tool} >/dev/null")
    # nothing of the checkout beyond .dockerignore reached the image: no tests, no caches
    manifest = json.load(open(r.host("/usr/local/lib/overlord/install-manifest.json")))
    assert not any("/test/" in p or "__pycache__/" in p and not p.endswith(".pyc")
                   for p in manifest["files"])


def _header_runs(image):
    """The header's one-off `docker run --rm ...` lines: (the command after the image name,
    whether a password comes on stdin)."""
    out = []
    for line in header(image.text):
        if "docker run --rm" not in line:
            continue
        piped = "|" in line
        words = shlex.split(line.split("|")[-1])
        words = words[words.index("run") + 1:]
        while words and words[0].startswith("-"):
            flag = words.pop(0)
            if flag in ("-v", "--volume", "-e", "--env", "--name", "-p", "--device", "--cap-add",
                        "--security-opt", "-u", "--user"):
                words.pop(0)
        assert words and words[0] == "overlord", line       # the image's name, then the command
        out.append((words[1:], piped))
    return out


def test_the_header_names_the_build_the_first_run_and_the_run_line(image):
    lines = header(image.text)
    assert "docker build -t overlord ." in lines
    run = [line for line in lines if "docker run -d" in line]
    assert len(run) == 1, lines
    words = run[0].replace("[", "").replace("]", "").split()
    for need in ("--device /dev/fuse", "--cap-add SYS_ADMIN", "--security-opt apparmor=unconfined",
                 "-v overlord-data:/data", "-p 7777:7777"):
        assert need in " ".join(words), need
    assert words[-1] == "overlord"
    steps = [argv[:2] for argv, _ in _header_runs(image)]
    assert steps == [["overlord", "tls"], ["overlord", "users"]], steps
    notes = " ".join(lines)
    assert "AppArmor" in notes and "docker-default" in notes and "nothing is fetched" in notes


def test_the_container_serves_and_its_healthcheck_passes(image):
    """As the image's USER with its ENV: the header's first-run steps, doctor, the CMD in the
    background, the HEALTHCHECK against it (and against nothing once it is stopped)."""
    r = image.root
    for argv, piped in _header_runs(image):
        proc = r.run(image.shell(argv), input=PASSWORD + "\n" if piped else None, check=False)
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        print(f"\n$ {shlex.join(argv)}\n{proc.stdout.strip()}")
    tls = r.host("/data/tls")
    for name, mode in (("cert.pem", None), ("key.pem", 0o600)):
        st = os.stat(os.path.join(tls, name))
        assert st.st_uid == 10001 and mode in (None, st.st_mode & 0o777), (name, oct(st.st_mode))
    assert os.path.isdir(r.host("/data/users/alice"))

    doctor = r.run(image.shell(["overlord", "doctor"]), check=False)
    print(f"\n$ overlord doctor (exit {doctor.returncode})\n{doctor.stdout}{doctor.stderr}")
    assert doctor.returncode == 0, doctor.stderr
    lines = doctor.stdout.splitlines()
    fuse = [line for line in lines if line.startswith("fuse backend")]
    assert fuse and fuse[0].endswith(": available"), doctor.stdout

    # what the image is for: a transaction on the fuse backend as the unprivileged user
    r.run("install -d -o overlord -g overlord /projects/app")
    run = r.run(image.shell(["overlord", "run", "--backend", "fuse", "-t", "/projects/app", "--",
                             "sh", "-c", "echo hello > greeting"]), check=False)
    print(f"$ overlord run --backend fuse ...\n{run.stdout}{run.stderr}")
    assert run.returncode == 0 and "pending" in run.stdout, run.stdout + run.stderr
    assert not os.path.exists(r.host("/projects/app/greeting"))       # not until the commit
    sid = run.stdout.split()[1]
    r.run(image.shell(["overlord", "commit", sid]))
    with open(r.host("/projects/app/greeting")) as f:
        assert f.read() == "hello\n"

    options, check = image.healthcheck
    assert set(options) <= {"interval", "timeout", "start-period", "retries", "start-interval"}
    cmd = image.cmd
    assert cmd[:2] == ["overlord", "ui"] and "--log-json" in cmd
    assert cmd[cmd.index("--tls-cert") + 1] == "/data/tls/cert.pem"
    assert cmd[cmd.index("--tls-key") + 1] == "/data/tls/key.pem"
    # one process tree in the root's PID namespace: the server in the background, waited for
    # (its "overlord ui:" line comes once it listens), the check, the server stopped, the
    # check again (it must fail now: the check can fail)
    script = f"""
{image.shell(cmd)} >/tmp/ui.out 2>/tmp/ui.err &
pid=$!
n=0
until grep -q '^overlord ui:' /tmp/ui.out; do
    if ! kill -0 $pid 2>/dev/null; then echo "server exited"; cat /tmp/ui.err; exit 3; fi
    n=$((n+1)); [ $n -lt 600 ] || {{ echo "server not up in 60 s"; cat /tmp/ui.err; exit 4; }}
    sleep 0.1
done
cat /tmp/ui.out
( {image.shell(check)} ) && echo "healthcheck: passed" || echo "healthcheck: FAILED $?"
kill -TERM $pid; wait $pid; echo "server exit: $?"
( {image.shell(check)} ) 2>/dev/null && echo "after stop: passed" || echo "after stop: failed"
echo "--- log"; cat /tmp/ui.err
"""
    started = time.monotonic()
    proc = r.run(script, check=False, timeout=180)
    print(f"\n(serve + healthcheck in {time.monotonic() - started:.1f} s)\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "overlord ui: https://localhost:7777/ (sign in with your account)" in out
    assert "healthcheck: passed" in out and "after stop: failed" in out
    assert "server exit: 0" in out
    log = [json.loads(line) for line in out.split("--- log", 1)[1].splitlines()
           if line.startswith("{")]
    assert any(e.get("path") == "/healthz" and e.get("status") == 200 for e in log), log
