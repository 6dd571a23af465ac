"""Commit under policy, the content gate, protected paths and the second model's verdicts:
ops.clearance, through the real CLI. Every refusal leaves the tree and the records untouched
and is on the audit chain as session.commit_refused."""
import json
import os

import pytest

from conftest import Ovl, require_backend, tree

AWS = "AKIA" + "QWERTYUIOPASDFGH"          # the shape, not a real key
WRITE_AWS = "echo 'aws_key = \"AKIA''QWERTYUIOPASDFGH\"' > creds.py"   # the key never whole in argv
APPROVE = [{"tool_calls": [{"name": "approve", "input": {"reason": "looks right"}}]}]
REJECT = [{"tool_calls": [{"name": "reject", "input": {"reason": "breaks the build",
                                                        "paths": ["hello.txt"]}}]}]


@pytest.fixture
def one(home):
    """Commit rules are the same on either backend: most tests run on the kernel one."""
    require_backend("kernel")
    return Ovl(home, "kernel")


def policy(home, rule=None, targets=None):
    data = {}
    if rule is not None:
        data["default"] = rule
    if targets:
        data["targets"] = targets
    (home / "policy.json").write_text(json.dumps(data))


def review(ovl, tmp_path, sid, turns, *flags, check=0):
    script = tmp_path / f"review-{len(list(tmp_path.glob('review-*.json')))}.json"
    script.write_text(json.dumps({"model": "reviewer-1", "turns": turns}))
    return ovl("review", sid, "--provider", "scripted", "--script", script, *flags, check=check)


def audit_lines(home, action=None):
    path = home / "audit.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [x for x in lines if action is None or x["action"] == action]


def refused(ovl, target, sid, *flags, says):
    before = tree(target)
    proc = ovl("commit", sid, *flags, check=1)
    assert says in proc.err, proc.err
    assert proc.err.startswith("overlord: ") and proc.err.count("\n") == 1, proc.err
    assert tree(target) == before
    assert ovl("diff", sid, check=0).out, "the session must still be pending with its change"
    last = audit_lines(ovl.home, "session.commit_refused")[-1]
    assert last["sid"] == sid and says in last["reason"]
    return proc


def test_require_review_demands_a_fresh_complete_approval(one, home, target, tmp_path):
    policy(home, {"require_review": True})
    sid, _ = one.sh(target, "echo changed > hello.txt")
    refused(one, target, sid, says="needs a fresh, complete second-model approval (none on record)")
    review(one, tmp_path, sid, APPROVE)
    proc = one("commit", sid, check=0)
    assert "countersigned by review #1" in proc.out
    assert (target / "hello.txt").read_text() == "changed\n"
    line = audit_lines(home, "session.commit")[-1]
    assert line["sid"] == sid and line["countersigned"]["review"] == 1
    assert line["countersigned"]["reviewer"] == "scripted:reviewer-1"


def test_countersigned_refuses_without_approval_and_a_stale_one(one, home, target, tmp_path):
    sid, _ = one.sh(target, "echo one > hello.txt")
    refused(one, target, sid, "--countersigned", says="--countersigned needs a fresh")
    review(one, tmp_path, sid, APPROVE)
    one("exec", sid, "--", "sh", "-c", "echo two > hello.txt", check=0)
    refused(one, target, sid, "--countersigned", says="every verdict on record is stale")
    review(one, tmp_path, sid, APPROVE)
    one("commit", sid, "--countersigned", check=0)
    assert (target / "hello.txt").read_text() == "two\n"


def test_a_selection_makes_the_approval_stale(one, home, target, tmp_path):
    sid, _ = one.sh(target, "echo one > hello.txt")
    one("exec", sid, "--", "sh", "-c", "echo new > b.txt", check=0)
    review(one, tmp_path, sid, APPROVE)
    refused(one, target, sid, "--countersigned", "--drop", "layer:1", says="stale")
    one("commit", sid, "--countersigned", check=0)


def test_a_fresh_rejection_blocks_unless_force(one, home, target, tmp_path):
    sid, _ = one.sh(target, "echo bad > hello.txt")
    review(one, tmp_path, sid, REJECT)
    refused(one, target, sid, says="the second model rejected this change (review #1: breaks the build)")
    one("commit", sid, "--force", check=0)
    line = audit_lines(home, "session.commit")[-1]
    assert line["overrode_rejection"] == 1


def test_policy_allow_force_false_refuses_force(one, home, target, tmp_path):
    policy(home, targets={str(target): {"allow_force": False}})
    sid, _ = one.sh(target, "echo bad > hello.txt")
    review(one, tmp_path, sid, REJECT)
    refused(one, target, sid, "--force", says=f"policy forbids --force here (allow_force: false, "
                                              f"from targets[{target}])")


def test_a_stale_rejection_does_not_block(one, home, target, tmp_path):
    sid, _ = one.sh(target, "echo bad > hello.txt")
    review(one, tmp_path, sid, REJECT)
    one("exec", sid, "--", "sh", "-c", "echo fixed > hello.txt", check=0)
    one("commit", sid, check=0)
    assert (target / "hello.txt").read_text() == "fixed\n"


def test_protected_paths_need_approval_and_never_force(ovl, home, target, tmp_path):
    policy(home, {"protect": ["sub/**"]})
    sid, _ = ovl.sh(target, "echo x > sub/a.txt; echo y > hello.txt")
    refused(ovl, target, sid, says="the protected path sub/a.txt needs a fresh")
    review(ovl, tmp_path, sid, APPROVE)
    refused(ovl, target, sid, "--force", says="--force is never allowed for a protected path: sub/a.txt")
    ovl("commit", sid, check=0)
    assert (target / "sub" / "a.txt").read_text() == "x\n"


def test_removing_the_directory_that_holds_a_protected_path_needs_approval(one, home, target):
    policy(home, {"protect": ["sub/a.txt"]})
    sid, _ = one.sh(target, "rm -r sub")
    refused(one, target, sid, says="the protected path sub needs a fresh")


def test_a_glob_policy_cannot_read_is_refused(one, home, target):
    policy(home, {"protect": ["[z-a]"]})
    sid, _ = one.sh(target, "echo y > hello.txt", check=1)
    assert sid is None


def test_unprotected_change_commits_as_before(one, home, target):
    policy(home, {"protect": ["sub/**"]})
    sid, _ = one.sh(target, "echo y > hello.txt")
    one("commit", sid, check=0)
    assert not audit_lines(home, "session.commit_refused")


def test_overlords_own_checkout_is_protected(one, home, tmp_path):
    src = tmp_path / "checkout"
    for rel in ("overlord/ops/__init__.py", "overlord/sandbox/jail.py", "overlord/agent/loop.py",
                "README.md"):
        os.makedirs(src / os.path.dirname(rel), exist_ok=True)
        (src / rel).write_text("# x\n")
    sid, _ = one.sh(src, "echo '# pwned' >> overlord/sandbox/jail.py")
    refused(one, src, sid, says="the protected path overlord/sandbox/jail.py")
    other, _ = one.sh(src, "echo more >> README.md", flags=("--stack",))
    one("commit", other, check=0)        # outside the package: an ordinary change


def test_gate_block_refuses_outright(ovl, home, target, tmp_path):
    policy(home, {"checks": {"secrets": "block"}})
    sid, _ = ovl.sh(target, WRITE_AWS)
    proc = refused(ovl, target, sid, says="the content gate blocks secrets in creds.py:1")
    assert AWS not in proc.err and AWS not in (home / "audit.jsonl").read_text()
    review(ovl, tmp_path, sid, APPROVE)
    refused(ovl, target, sid, "--force", says="the content gate blocks")


def test_gate_countersign_is_the_default_for_secrets(one, home, target, tmp_path):
    sid, _ = one.sh(target, WRITE_AWS)
    refused(one, target, sid, says="the content gate's secrets in creds.py:1")
    review(one, tmp_path, sid, APPROVE)
    proc = one("commit", sid, check=0)
    assert "countersign  secrets  creds.py:1" in proc.err and AWS not in proc.err


def test_gate_warn_prints_and_commits(one, home, target):
    sid, _ = one.sh(target, "printf 'a\\0b' > blob.bin")
    proc = one("commit", sid, check=0)
    assert "overlord: note: warn  binaries  blob.bin" in proc.err
    assert (target / "blob.bin").read_bytes() == b"a\0b"


def test_gate_off_says_nothing(one, home, target):
    policy(home, {"checks": {"binaries": "off"}})
    sid, _ = one.sh(target, "printf 'a\\0b' > blob.bin")
    proc = one("commit", sid, check=0)
    assert "binaries" not in proc.err


def test_a_broken_policy_refuses_commit(one, home, target):
    sid, _ = one.sh(target, "echo y > hello.txt")
    (home / "policy.json").write_text("{not json")
    before = tree(target)
    proc = one("commit", sid, check=1)
    assert proc.err.startswith("overlord: policy ") and "policy.json" in proc.err
    assert tree(target) == before
    (home / "policy.json").write_text(json.dumps({"default": {"jail": True, "bogus": 1}}))
    proc = one("commit", sid, check=1)
    assert "bogus" in proc.err and tree(target) == before
