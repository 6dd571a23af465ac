"""Red team, channels to the host: with --net none the jail has its own empty network (so no
host loopback service and no abstract socket), no host socket file exists inside, and the
host's System V and POSIX IPC objects are out of reach."""
import ctypes
import os
import socket
import textwrap
import threading
import uuid

import pytest

from rtlib import jail_fixture  # noqa: F401  (the `jail` fixture)

CONNECT = textwrap.dedent("""
    def connect(family, address):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(address)
        finally:
            s.close()
""")


@pytest.fixture
def listener():
    """A TCP service on the host's loopback that accepts until the test ends."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted = []
    first = threading.Event()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            first.set()
            conn.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted, first
    try:
        srv.shutdown(socket.SHUT_RDWR)   # wakes the accept: joined before the fd is closed
    except OSError:
        pass
    t.join(10)
    srv.close()


def test_host_loopback_service(jail, listener):
    port, accepted, first = listener
    code = CONNECT + textwrap.dedent("""
        port = int(ARGS[0])
        OUT["127.0.0.1"] = attempt(connect, socket.AF_INET, ("127.0.0.1", port))
        OUT["127.0.0.2"] = attempt(connect, socket.AF_INET, ("127.0.0.2", port))
        OUT["192.0.2.1"] = attempt(connect, socket.AF_INET, ("192.0.2.1", port))   # off-host
        OUT["interfaces"] = [name for _, name in socket.if_nameindex()]
    """)
    control = jail.host_py(code, port)
    assert control["127.0.0.1"] == "OK" and first.wait(10), control
    res = jail.py(code, port)
    assert res.rt["127.0.0.1"] == "ECONNREFUSED" and res.rt["127.0.0.2"] == "ECONNREFUSED", res
    assert res.rt["192.0.2.1"] == "ENETUNREACH" and res.rt["interfaces"] == ["lo"], res
    assert accepted == [1], "the jail reached the host's loopback service"


@pytest.fixture
def abstract_listener():
    name = b"\0rt-abstract-" + uuid.uuid4().hex.encode()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(4)
    yield name
    srv.close()


def test_host_abstract_unix_socket(jail, abstract_listener):
    code = CONNECT + textwrap.dedent("""
        OUT["connect"] = attempt(connect, socket.AF_UNIX, bytes.fromhex(ARGS[0]))
    """)
    control = jail.host_py(code, abstract_listener.hex())
    assert control["connect"] == "OK", control
    res = jail.py(code, abstract_listener.hex())
    assert res.rt["connect"] == "ECONNREFUSED", res


def test_host_unix_socket_by_path(jail, tmp_path):
    sockdir = tmp_path / "sockets"
    sockdir.mkdir()
    path = str(sockdir / "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    code = CONNECT + textwrap.dedent("""
        for p in ARGS:
            OUT[p] = attempt(connect, socket.AF_UNIX, p)
    """)
    usual = ["/run/dbus/system_bus_socket", "/var/run/docker.sock", "/run/systemd/private",
             "/tmp/.X11-unix/X0", "/run/user/%d/bus" % os.getuid()]
    try:
        control = jail.host_py(code, path)
        assert control[path] == "OK", control
        res = jail.py(code, path, *usual)
    finally:
        srv.close()
    assert res.rt == {p: "ENOENT" for p in [path] + usual}, res


# -- System V and POSIX IPC --------------------------------------------------------------------

IPC_CREAT, IPC_RMID = 0o1000, 0
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p
LIBC.mq_open.restype = ctypes.c_int
SHM_SECRET = b"host shared memory the jail must not see\0"


@pytest.fixture
def host_shm():
    """A System V shared memory segment of the operator's, holding a secret."""
    key = 0x52540000 | (uuid.uuid4().int & 0xFFFF)
    shmid = LIBC.shmget(key, 4096, IPC_CREAT | 0o600)
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    addr = LIBC.shmat(shmid, None, 0)
    ctypes.memmove(addr, SHM_SECRET, len(SHM_SECRET))
    yield key, shmid
    LIBC.shmdt(ctypes.c_void_p(addr))
    LIBC.shmctl(shmid, IPC_RMID, None)


SHM_PROBE = """
    LIBC.shmat.restype = ctypes.c_void_p
    key, shmid = int(ARGS[0]), int(ARGS[1])
    got = LIBC.shmget(key, 0, 0)
    OUT["shmget"] = "OK" if got >= 0 else ename(ctypes.get_errno())
    addr = LIBC.shmat(shmid, None, 0)        # by id, as if guessed
    if addr in (None, 2 ** 64 - 1):
        OUT["shmat"] = ename(ctypes.get_errno())
    else:
        OUT["shmat"] = "OK"
        OUT["read"] = ctypes.string_at(addr).decode()
    if ARGS[2] == "jail":        # destroying the host's segment is part of the attack
        OUT["shm_rmid"] = "OK" if LIBC.shmctl(shmid, 0, None) == 0 else ename(ctypes.get_errno())
"""


def test_host_system_v_shared_memory(jail, host_shm):
    key, shmid = host_shm
    control = jail.host_py(SHM_PROBE, key, shmid, "host")
    assert control["shmget"] == "OK" and control["read"] == SHM_SECRET[:-1].decode(), control
    res = jail.py(SHM_PROBE, key, shmid, "jail")
    assert (res.rt["shmget"], res.rt["shmat"], res.rt["shm_rmid"]) == \
        ("ENOENT", "EINVAL", "EINVAL"), res
    buf = ctypes.create_string_buffer(512)      # struct shmid_ds (112 bytes on x86_64) fits
    assert LIBC.shmctl(shmid, 2, buf) == 0, "the host's segment is gone"       # IPC_STAT


@pytest.fixture
def host_mqueue():
    name = b"/rt-mq-" + uuid.uuid4().hex.encode()
    mqd = LIBC.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    assert mqd >= 0, os.strerror(ctypes.get_errno())
    assert LIBC.mq_send(mqd, b"host message", 12, 0) == 0
    yield name
    LIBC.mq_close(mqd)
    LIBC.mq_unlink(name)


def test_host_posix_message_queue(jail, host_mqueue):
    code = """
        LIBC.mq_open.restype = ctypes.c_int
        name = ARGS[0].encode()
        ctypes.set_errno(0)
        mqd = LIBC.mq_open(name, os.O_RDWR)
        OUT["mq_open"] = "OK" if mqd >= 0 else ename(ctypes.get_errno())
        if mqd >= 0:
            buf = ctypes.create_string_buffer(8192)
            n = LIBC.mq_receive(mqd, buf, 8192, None) if ARGS[1] == "jail" else -1
            OUT["received"] = buf.raw[:n].decode() if n > 0 else None
    """
    control = jail.host_py(code, host_mqueue.decode(), "host")
    assert control["mq_open"] == "OK", control
    res = jail.py(code, host_mqueue.decode(), "jail")
    assert res.rt == {"mq_open": "ENOENT"}, res
