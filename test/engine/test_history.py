"""Savepoints: exec, savepoints, rewind, fork, compare and commit by cause."""
import json

import pytest

from conftest import SESSION_RE


def points(ovl, sid):
    return json.loads(ovl("savepoints", sid, "--json", check=0).out)


def test_exec_seals_a_savepoint_per_writing_command(ovl, target):
    sid, _ = ovl.sh(target, "echo 1 > one")
    proc = ovl("exec", sid, "--", "sh", "-c", "echo out; echo 2 > two; exit 5")
    assert proc.returncode == 5 and proc.out == "out\n"
    ovl("exec", sid, "--", "true", check=0)              # writes nothing: no savepoint
    pts = points(ovl, sid)
    assert [p["layer"] for p in pts] == [0, 1]
    assert "echo 2 > two" in pts[1]["caused_by"]["command"]
    lines = ovl("savepoints", sid, check=0).out.splitlines()
    assert lines[0].startswith("@0  1 path  ") and lines[1].startswith("@1  1 path  ")
    assert ovl.diff(sid) == [("added", "one"), ("added", "two")]


def test_rewind_reproduces_the_tree_of_a_savepoint(ovl, target):
    sid, _ = ovl.sh(target, "echo a > a")
    views = {}
    for i in range(1, 5):
        ovl("exec", sid, "--", "sh", "-c", f"echo {i} >> a; echo {i} > f{i}; rm -f f{i - 1}", check=0)
    for n in (3, 1):
        # the view at @n, seen from inside the session after rewinding
        ovl("rewind", sid, "--to", n, check=0)
        views[n] = ovl("exec", sid, "--", "sh", "-c", "cat a; ls", check=0).out
    assert views[3].splitlines()[:4] == ["a", "1", "2", "3"]
    assert "f3" in views[3] and "f4" not in views[3]
    assert views[1].splitlines()[:2] == ["a", "1"] and "f2" not in views[1]
    assert len(points(ovl, sid)) == 2
    archives = list((ovl.home / "sessions" / sid).glob("rewound-*.json"))
    assert len(archives) == 2          # each rewind archived what it dropped


@pytest.mark.parametrize("bad", ["7", "-1", "x", "1.5"])
def test_rewind_out_of_range_is_refused(ovl, target, bad):
    sid, _ = ovl.sh(target, "echo a > a")
    before = points(ovl, sid)
    proc = ovl("rewind", sid, "--to", bad)
    assert proc.returncode == 2 and proc.err.startswith("overlord: ") and "Traceback" not in proc.err
    assert points(ovl, sid) == before


def test_fork_continues_independently_and_compare_shows_divergence(ovl, target):
    sid, _ = ovl.sh(target, "echo base > shared.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo a > only-a.txt; rm hello.txt", check=0)
    proc = ovl("fork", sid, "--at", "0", check=0)
    fork = SESSION_RE.search(proc.out).group(1)
    assert fork != sid and len(points(ovl, fork)) == 1
    ovl("exec", fork, "--", "sh", "-c", "echo b > only-b.txt; echo other > shared.txt", check=0)
    rows = dict((line.split("  ", 1)[1], line.split("  ", 1)[0])
                for line in ovl("compare", sid, fork, check=0).out.splitlines())
    assert rows == {"only-a.txt": "only in A", "hello.txt": "only in A", "only-b.txt": "only in B",
                    "shared.txt": "differs"}
    data = json.loads(ovl("compare", sid, fork, "--json", check=0).out)
    assert {"path": "shared.txt", "status": "differs"} in data
    # committing one makes the other's snapshot stale where they overlap
    ovl("commit", fork, check=0)
    assert (target / "shared.txt").read_text() == "other\n"
    proc = ovl("commit", sid)
    assert proc.returncode == 1 and "shared.txt" in proc.err
    assert (target / "shared.txt").read_text() == "other\n"


def test_fork_and_compare_refusals(ovl, target):
    sid, _ = ovl.sh(target, "echo a > a")
    assert ovl("compare", sid, sid).returncode == 2
    assert ovl("fork", sid, "--at", "3").returncode == 2
    ovl("commit", sid, check=0)
    proc = ovl("fork", sid, "--at", "0")
    assert proc.returncode == 1 and "committed" in proc.err


def test_commit_by_cause_only_and_drop(ovl, target):
    sid, _ = ovl.sh(target, "echo 0 > zero")
    ovl("exec", sid, "--", "sh", "-c", "echo 1 > one", check=0)
    ovl("exec", sid, "--", "sh", "-c", "echo 2 > two", check=0)
    ovl("commit", sid, "--drop", "layer:1", check=0)
    assert sorted(p.name for p in target.iterdir()) == ["hello.txt", "sub", "two", "zero"]


@pytest.mark.parametrize("sel", ["layer:9", "tool:shell", "bogus", "layer:x"])
def test_selectors_that_match_nothing_or_are_malformed(ovl, target, sel):
    sid, _ = ovl.sh(target, "echo 0 > zero")
    proc = ovl("commit", sid, "--only", sel)
    assert proc.returncode == 2 and proc.err.startswith("overlord: ")
    assert not (target / "zero").exists()


def test_conflicts_cover_paths_replay_would_touch(ovl, target):
    """A file one layer created and a later one deleted cannot clobber a same-named file
    that appeared outside meanwhile."""
    sid, _ = ovl.sh(target, "echo mine > tmp.txt")
    ovl("exec", sid, "--", "rm", "tmp.txt", check=0)
    (target / "tmp.txt").write_text("theirs\n")
    proc = ovl("commit", sid)
    assert proc.returncode == 1 and "tmp.txt" in proc.err
    assert (target / "tmp.txt").read_text() == "theirs\n"


def _fill(sid, ops, count, start=0):
    for i in range(start, start + count):
        assert ops.exec_in(sid, ["sh", "-c", f"echo {i} > f{i}; echo {i} >> log"]).exit_code == 0


def test_past_the_stack_limit_the_top_savepoint_absorbs_and_records_every_cause(
        home, backend, monkeypatch, target):
    """No silent coarsening: at the limit the top savepoint takes further commands, says so,
    and keeps each cause (the limit is lowered here; the real one is tested below)."""
    from overlord import ops
    from overlord.txn import session, store
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    monkeypatch.setattr(session, "MAX_SAVEPOINTS", 6)
    sid = ops.run(["sh", "-c", "echo start > f"], target=str(target)).sid
    _fill(sid, ops, 8)
    pts = ops.savepoints(sid)
    assert len(pts) == 6 and pts[-1]["coarse"] and len(pts[-1]["causes"]) == 4
    assert all("echo" in c["command"] for c in pts[-1]["causes"])
    records = [r for r in store.read_jsonl(ops.get_session(sid).path("provenance.jsonl"))
               if r.get("shared")]
    assert {r["caused_by"]["command"] for r in records} >= {c["command"] for c in pts[-1]["causes"][1:]}
    view = ops.exec_in(sid, ["sh", "-c", "test $(wc -l < log) -eq 8"])
    assert view.exit_code == 0                       # nothing was lost
    ops.rewind(sid, 2)                               # exact below the coarse savepoint
    assert ops.exec_in(sid, ["sh", "-c", "test $(wc -l < log) -eq 2 && test ! -e f2"]).exit_code == 0


def test_the_real_stack_limit_on_the_kernel_backend(home, monkeypatch, target):
    from overlord import ops
    from overlord.txn import session
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "kernel")
    sid = ops.run(["sh", "-c", "echo start > f"], target=str(target)).sid
    _fill(sid, ops, session.MAX_SAVEPOINTS + 1)
    pts = ops.savepoints(sid)
    assert len(pts) == 499 and pts[-1]["coarse"] and len(pts[-1]["causes"]) == 3
    assert ops.exec_in(sid, ["sh", "-c", "test $(wc -l < log) -eq 500"]).exit_code == 0
    ops.rewind(sid, 250)
    assert ops.exec_in(sid, ["sh", "-c", "test $(wc -l < log) -eq 250 && test -e f249 && test ! -e f250"]).exit_code == 0


VIEW_DIGEST = ("find . -printf '%y %m %p %l\\n' | LC_ALL=C sort; "
               "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")


def _random_op(rng, step):
    n, m = rng.randrange(6), rng.randrange(4)
    return rng.choice([
        f"echo s{step} > f{n}",
        f"echo more{step} >> f{n} 2>/dev/null || true",
        f"rm -rf f{n}",
        f"mkdir -p d{m}/sub && echo x{step} > d{m}/sub/x{n}",
        f"rm -rf d{m}",
        f"rm -rf d{m} && echo file{step} > d{m}",
        f"rm -rf f{n} && mkdir f{n} && echo in{step} > f{n}/inner",
        f"[ -f f{n} ] && chmod 600 f{n}",
        f"ln -sfn f{n} l{m}",
        f"mv f{n} f{(n + 1) % 6} 2>/dev/null || true",
        f"rm -rf sub && echo replaced{step} > sub",
    ])


def test_rewind_to_random_savepoints_reproduces_their_trees(home, backend, monkeypatch, target, tmp_path):
    """Every savepoint's tree, as seen inside the session, equals the same shell steps applied
    to a plain copy; after rewinding to a random @N the session sees exactly @N's tree."""
    import random
    import shutil
    import subprocess
    from overlord import ops
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    model = tmp_path / "model"
    shutil.copytree(target, model, symlinks=True)
    rng = random.Random(4)
    sid = ops.run(["sh", "-c", "echo start > f0"], target=str(target)).sid
    subprocess.run(["sh", "-c", "echo start > f0"], cwd=model, check=True)

    def inside():
        return ops.exec_capture(sid, ["sh", "-c", VIEW_DIGEST], cap=1 << 20).stdout.decode()

    def plain():
        return subprocess.run(["sh", "-c", VIEW_DIGEST], cwd=model, capture_output=True,
                              check=True).stdout.decode()
    trees = {0: plain()}
    assert inside() == trees[0]
    step = 1
    while len(ops.savepoints(sid)) < 40:
        op = f"( {_random_op(rng, step)} ) 2>/dev/null || true"
        step += 1
        subprocess.run(["sh", "-c", op], cwd=model, check=True)
        res = ops.exec_in(sid, ["sh", "-c", op])
        assert res.exit_code == 0, op
        if res.layer is not None:
            trees[res.layer] = plain()
            assert inside() == trees[res.layer], (res.layer, op)
        else:
            assert plain() == trees[max(trees)], op     # wrote nothing, changed nothing
    for n in sorted(rng.sample(sorted(trees), 5), reverse=True):
        ops.rewind(sid, n)
        assert inside() == trees[n], n
