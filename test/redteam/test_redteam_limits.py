"""Red team, exhaustion: a command granted little of the machine cannot take more — a fork
bomb, a memory hog, a disk fill and a file-size bomb each cost the session, not the host. Each
attack's positive control is the same program under an unlimited grant (`key=0`), which gets
what the limited one is refused."""
import os
import time

from rtlib import PY, host_pid_count, pids_with
from rtlib import jail_fixture  # noqa: F401  (the `jail` fixture)

MiB = 1 << 20

BOUNDED_BOMB = """
    # fork until refused or until ARGS[0] children exist; every child waits for the parent
    limit = int(ARGS[0])
    r, w = os.pipe()
    count, error = 0, None
    while count < limit:
        try:
            pid = os.fork()
        except OSError as e:
            error = ename(e.errno)
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        count += 1
    os.close(w)
    for _ in range(count):
        os.wait()
    OUT["forked"], OUT["error"] = count, error
"""


def await_host_pid_count(at_most, seconds=10):
    deadline = time.monotonic() + seconds
    while host_pid_count() > at_most and time.monotonic() < deadline:
        os.sched_yield()
    return host_pid_count()


def test_fork_bomb_is_held_to_the_pid_grant(jail):
    control = jail.py(BOUNDED_BOMB, 150, flags=["--limit", "pids=0"])
    assert control.rt == {"forked": 150, "error": None}, control
    res = jail.py(BOUNDED_BOMB, 150, flags=["--limit", "pids=64"])
    assert res.rt["error"] == "EAGAIN" and res.rt["forked"] < 64, res


PEAK_MONITOR = """
import os, sys, time
# how many processes the PID namespace held at most, kept in the overlay as it grows
peak, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    n = sum(1 for p in os.listdir("/proc") if p.isdigit())
    if n > peak:
        peak = n
        with open("peak.txt", "w") as f:
            f.write(str(peak))
"""
# every process forks two children and retries a refused fork forever; the tree stops at
# depth 7 (255 processes), so even a host without the grant's enforcement survives it
FOREVER_BOMB = """
import os, signal
depth, children = 0, 0
while True:
    if depth < 7 and children < 2:
        try:
            if os.fork() == 0:
                depth, children = depth + 1, 0
            else:
                children += 1
        except OSError:
            pass
    else:
        signal.pause()
"""


def test_fork_bomb_ends_and_the_host_recovers(jail):
    baseline = host_pid_count()
    started = time.monotonic()
    res = jail.run(["/bin/sh", "-c", '"$1" -c "$2" "$0" 4 & "$1" -c "$3" "$0"', jail.marker,
                    PY, PEAK_MONITOR, FOREVER_BOMB],
                   flags=["--limit", "pids=64", "--timeout", "5"])
    elapsed = time.monotonic() - started
    assert res.code == 124 and elapsed < 10, (elapsed, res)
    assert pids_with(jail.marker) == []
    assert await_host_pid_count(baseline + 16) <= baseline + 16
    # it was a real bomb (the namespace filled up) and it was held to the grant
    peaks = list(jail.session_dir(res.sid).glob("layers/*/peak.txt"))
    assert peaks, res
    peak = int(peaks[-1].read_text())
    assert 48 <= peak <= 64, peak


HOG = """
    chunks, got = [], 0
    try:
        while got < int(ARGS[0]):
            chunks.append(bytearray(b"\\x01") * (16 << 20))      # 16 MiB, every page touched
            got += 16
    except MemoryError:
        OUT["stopped"] = "MemoryError"
    OUT["allocated_mb"] = got
"""


def test_memory_hog_is_stopped(jail):
    control = jail.py(HOG, 512, flags=["--limit", "memory_mb=0"])
    assert control.rt == {"allocated_mb": 512}, control
    res = jail.py(HOG, 512, flags=["--limit", "memory_mb=256"], check=None)
    killed = res.code == 128 + 9 and res.rt is None                      # the cgroup's OOM kill
    refused = res.code == 0 and res.rt is not None and res.rt.get("stopped") == "MemoryError" \
        and res.rt["allocated_mb"] <= 256
    assert killed or refused, res
    assert pids_with(jail.marker) == []


FILL = """
    # many files, each under any file-size limit: only the disk grant can stop this
    written = 0
    os.makedirs("fill", exist_ok=True)
    block = b"\\xa5" * (1 << 20)
    while written < int(ARGS[0]):
        with open(f"fill/{written // 8:05d}", "wb") as f:
            for _ in range(8):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        written += 8
    OUT["written_mb"] = written
"""


def layer_bytes(session_dir):
    total = 0
    for root, _, files in os.walk(session_dir):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total


def test_disk_fill_is_stopped(jail):
    control = jail.py(FILL, 120, flags=["--limit", "disk_mb=0"])
    assert control.rt == {"written_mb": 120}, control
    res = jail.py(FILL, 400, flags=["--limit", "disk_mb=50"], check=None)
    assert res.code == 122, res
    meta = jail.meta(res.sid)
    assert meta["limit"] == "disk_mb", meta
    assert layer_bytes(jail.session_dir(res.sid)) < 400 * MiB
    # the session may run nothing more
    later = jail.exec(res.sid, ["sh", "-c", "echo more > more.txt"])
    assert later.code != 0, later
    assert ("added", "more.txt") not in jail.ovl.diff(res.sid)


FSIZE = """
    written, error = 0, None
    with open("big", "wb", buffering=0) as f:
        try:
            for _ in range(int(ARGS[0])):
                f.write(b"\\0" * (1 << 20))
                written += 1
        except OSError as e:
            error = ename(e.errno)
    OUT["written_mb"], OUT["error"] = written, error
    OUT["size"] = os.stat("big").st_size
"""


def test_file_size_bomb(jail):
    control = jail.py(FSIZE, 20, flags=["--limit", "fsize_mb=0"])
    assert control.rt == {"written_mb": 20, "error": None, "size": 20 * MiB}, control
    res = jail.py(FSIZE, 20, flags=["--limit", "fsize_mb=10"])
    assert res.rt == {"written_mb": 10, "error": "EFBIG", "size": 10 * MiB}, res
    # a shell tool that ignores nothing: SIGXFSZ or EFBIG, never a 20 MiB file
    tool = jail.sh("head -c 20971520 /dev/zero > big2; echo rc=$?; wc -c < big2",
                   flags=["--limit", "fsize_mb=10"])
    assert "rc=0" not in tool.out and str(10 * MiB) in tool.out, tool


DESCRIPTORS = """
    fds, error = [], None
    try:
        while len(fds) < int(ARGS[0]):
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        error = ename(e.errno)
    OUT["opened"], OUT["error"] = len(fds), error
"""


def test_descriptor_exhaustion(jail):
    control = jail.py(DESCRIPTORS, 500, flags=["--limit", "nofile=0"])
    assert control.rt == {"opened": 500, "error": None}, control
    res = jail.py(DESCRIPTORS, 500, flags=["--limit", "nofile=64"])
    assert res.rt["error"] == "EMFILE" and res.rt["opened"] < 64, res
