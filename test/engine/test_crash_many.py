"""Fault injection on a commit of thousands of files: killed at 200+ points spread over the
journal write, the replay steps and completion, the tree is always exactly as before or as
committed once the next overlord command (here: ops.recover) has run, and the record agrees."""
import hashlib
import os

from overlord import ops
from overlord.txn import objects, replay, store

FILES = 2000
SCRIPT = ("i=0; while [ $i -lt %d ]; do d=d$((i / 200)); mkdir -p $d; echo new$i > $d/f$i; "
          "i=$((i + 1)); done; for f in old/*; do echo changed >> $f; done; rm -rf gone") % FILES


def make_target(root):
    os.mkdir(root)
    os.mkdir(os.path.join(root, "old"))
    os.mkdir(os.path.join(root, "gone"))
    for i in range(200):
        with open(os.path.join(root, "old", f"o{i}"), "w") as f:
            f.write(f"old{i}\n")
        with open(os.path.join(root, "gone", f"g{i}"), "w") as f:
            f.write(f"gone{i}\n")


def digest(root):
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                h.update(os.path.relpath(p, root).encode() + b"\0" + f.read())
        for name in dirs:
            h.update(os.path.relpath(os.path.join(dirpath, name), root).encode() + b"/\0")
    return h.hexdigest()


def killed_commit(sid, point):
    """Commit in a child that dies (as by kill -9) at a fault point: ("save", n) during the
    n-th journal write, ("step", n) before replay step n, ("finish", 0) right after the
    journal is marked done, ("keep", n) at the n-th replaced file kept as an object, ("pack", 0)
    as the commit's objects are finished, before its record is written."""
    pid = os.fork()
    if pid == 0:
        kind, n = point
        calls = {"save": 0, "step": 0, "keep": 0}
        real_save, real_apply, real_finish = replay.Journal.save, replay._apply, replay.Journal.finish
        real_take, real_pack = objects.Keeper.take_at, objects.Keeper.finish

        def save(self):
            if kind == "save" and calls["save"] == n:
                # die half-way through writing the journal: a torn temp file, no rename
                os.makedirs(replay.journal_dir(), exist_ok=True)
                with open(replay.journal_path(self.sid) + ".tmp-torn", "w") as f:
                    f.write('{"sid": "')
                os._exit(9)
            calls["save"] += 1
            return real_save(self)

        def apply(*args, **kw):
            if kind == "step" and calls["step"] == n:
                os._exit(9)
            calls["step"] += 1
            return real_apply(*args, **kw)

        def finish(self):
            real_finish(self)
            if kind == "finish":
                os._exit(9)

        def take_at(self, *args):
            if kind == "keep" and calls["keep"] == n:
                os._exit(9)
            calls["keep"] += 1
            return real_take(self, *args)

        def pack(self):
            if kind == "pack":
                os._exit(9)
            return real_pack(self)
        replay.Journal.save, replay._apply, replay.Journal.finish = save, apply, finish
        objects.Keeper.take_at, objects.Keeper.finish = take_at, pack
        try:
            ops.commit(sid)
        except BaseException as exc:
            print(f"commit raised {type(exc).__name__}: {exc}", flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


AFTER_POINTS = [("finish", 0), ("keep", 0), ("keep", 150), ("pack", 0)]


def test_commit_killed_at_200_points(home, backend, monkeypatch, tmp_path):
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    target = str(tmp_path / "t")
    make_target(target)
    before = digest(target)
    sid = ops.run(["sh", "-c", SCRIPT], target=target).sid
    steps = len(ops.get_session(sid).view())
    assert steps > FILES
    points = [("save", 0)] + [("step", k) for k in range(0, steps, max(1, steps // 200))]
    assert len(points) >= 200
    outcomes = {"before": 0, "after": 0}
    after = None
    for point in points + AFTER_POINTS:
        if point in AFTER_POINTS[1:]:           # each completion point needs a fresh commit
            target = str(tmp_path / f"t-{point[0]}-{point[1]}")
            make_target(target)
            sid = ops.run(["sh", "-c", SCRIPT], target=target).sid
        code = killed_commit(sid, point)
        assert code == 9, f"the commit did not reach fault point {point}"
        ops.recover()
        got = digest(target)
        state = ops.get_session(sid).meta["state"]
        assert not any(n.startswith(".overlord-txn") for n in os.listdir(target))
        assert not replay.pending_journals()
        if got == before:
            assert state == "pending", point
            outcomes["before"] += 1
        else:
            assert state == "committed", (point, state)
            assert after is None or got == after, point
            after = got
            outcomes["after"] += 1
    assert outcomes["after"] == len(AFTER_POINTS) and outcomes["before"] == len(points), outcomes
    # the committed tree is the session's: every new file, every appended line, gone removed
    assert after and os.path.isfile(os.path.join(target, "d0", "f0"))
    assert not os.path.exists(os.path.join(target, "gone"))
    with open(os.path.join(target, "old", "o7")) as f:
        assert f.read() == "old7\nchanged\n"
    print(f"crash points: {len(points) + len(AFTER_POINTS)}; recovered to before: "
          f"{outcomes['before']}, to after: {outcomes['after']}")
    assert store.load_meta(sid)["state"] == "committed"
