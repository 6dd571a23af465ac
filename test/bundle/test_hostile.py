"""Bundles that are not what they claim: each refused with one line, nothing kept.

Every crafted bundle here is otherwise well-formed (a manifest listing its members exactly),
so the refusal is the flaw the test put in, not a side effect."""
import gzip
import io
import json
import os
import tarfile

import pytest

from bundlelib import (crafted, info, key_of, machine, manifest_of, meta_member,
                       read_bundle, session, share_key, untouched_store, write_tgz, export)


@pytest.fixture
def b(tmp_path):
    return machine(tmp_path, "b")


def refused(ovl, path, *words, env=None, flags=()):
    proc = ovl("import", path, *flags, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.out, proc.err)
    assert "Traceback" not in proc.err, proc.err
    lines = [ln for ln in proc.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    for w in words:
        assert w in proc.err, (w, proc.err)
    untouched_store(ovl)
    return proc.err


def test_not_gzip(tmp_path, b):
    p = tmp_path / "x.ovl"
    p.write_bytes(b"just some text, not a bundle\n")
    refused(b, p, "not gzip")
    write_tgz(p, [meta_member()], raw=True)          # a tar, but not compressed
    refused(b, p, "not gzip")


def test_not_a_tar(tmp_path, b):
    p = tmp_path / "x.ovl"
    p.write_bytes(gzip.compress(os.urandom(5000)))
    refused(b, p, "not a tar")
    p.write_bytes(gzip.compress(b""))
    refused(b, p, "not a bundle")


def test_damaged_gzip(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [])
    data = p.read_bytes()
    p.write_bytes(data[:len(data) // 2])             # cut short
    refused(b, p, "not a bundle")
    p.write_bytes(data[:20] + bytes(x ^ 0xff for x in data[20:60]) + data[60:])
    refused(b, p)


def test_missing_file(tmp_path, b):
    proc = b("import", tmp_path / "nope.ovl")
    assert proc.returncode == 2 and proc.err.startswith("overlord: cannot read"), proc.err


@pytest.mark.parametrize("name", ["../escape", "record/../../escape", "/etc/passwd",
                                  "changes/tree/../../x", "changes/tree/./x", "changes/tree//x"])
def test_bad_names(tmp_path, b, name):
    p = tmp_path / "x.ovl"
    body = [meta_member(), (info(name), b"evil\n")]
    # listed in the manifest too (the manifest check refuses it) ...
    write_tgz(p, manifest_of(body) + body)
    refused(b, p)
    # ... and not listed (the member check refuses it first)
    write_tgz(p, manifest_of(body[:1]) + body)
    refused(b, p)
    assert not os.path.exists("/escape") and not os.path.exists(tmp_path / "escape")


def test_unknown_prefix(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("elsewhere/x"), b"x")])
    refused(b, p, "outside the known names")
    crafted(p, [(info("record/audit.key"), b"k" * 32)])
    refused(b, p, "outside the known names")
    crafted(p, [(info("objects/notahash"), b"x")])
    refused(b, p, "outside the known names")


@pytest.mark.parametrize("kind,words", [("chr", "character device"), ("blk", "block device"),
                                        ("fifo", "fifo"), ("hardlink", "hard link")])
def test_special_members(tmp_path, b, kind, words):
    p = tmp_path / "x.ovl"
    ti = info("changes/tree/dev", kind, link="changes/tree/a" if kind == "hardlink" else None)
    if kind in ("chr", "blk"):
        ti.devmajor, ti.devminor = 1, 3
    body = [meta_member(state="pending"), (info("changes/tree/a"), b"a"), (ti, None)]
    write_tgz(p, manifest_of(body[:2], state="pending") + body)
    refused(b, p, words)


def test_symlink_pointing_outside(tmp_path, b):
    p = tmp_path / "x.ovl"
    for link in ("/etc", "../../etc", "a/../../../x", ""):
        crafted(p, [(info("changes/tree/sub/lnk", "symlink", link=link), None)], state="pending")
        refused(b, p)


def test_symlink_outside_changes(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("record/transcript.jsonl", "symlink", link="meta.json"), None)])
    refused(b, p, "symlink outside changes/tree")
    crafted(p, [(info("objects/" + "0" * 64, "symlink", link="x"), None)])
    refused(b, p, "symlink outside changes/tree")


def test_path_under_a_symlink(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("changes/tree/d", "symlink", link="e"), None),
                (info("changes/tree/d/x"), b"through the link\n")], state="pending")
    refused(b, p, "under a symlink")


def test_directory_outside_changes(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("record/x", "dir", mode=0o755), None)])
    refused(b, p)


def test_member_over_the_cap(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("changes/tree/big"), b"x" * 5000)], state="pending")
    refused(b, p, "over the cap", env={"OVERLORD_BUNDLE_MEMBER_MAX": "4096"})


def test_gzip_bomb_refused_while_streaming(tmp_path, b):
    """Many members each under the member cap, 64 MiB of zeros in all, compressed to a few
    hundred KB: refused once the stream passes the total cap, never extracted."""
    p = tmp_path / "bomb.ovl"
    chunk = bytes(1 << 20)
    members = [(info(f"changes/tree/z{i}"), chunk) for i in range(64)]
    crafted(p, members, state="pending")
    assert p.stat().st_size < 1 << 20
    err = refused(b, p, "decompresses to more than", env={"OVERLORD_BUNDLE_MAX": str(8 << 20)})
    assert "OVERLORD_BUNDLE_MAX" in err


def test_declared_size_bomb(tmp_path, b):
    """A header claiming a huge member is refused at its header, before any of it is read."""
    p = tmp_path / "x.ovl"
    body = [meta_member()]
    head = manifest_of(body) + body
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in head:
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        big = info("changes/tree/huge")
        big.size = 1 << 40
        tar.addfile(big)                     # header only: the data never follows
    p.write_bytes(gzip.compress(buf.getvalue()[:-1024]))
    refused(b, p, "over the cap")


def test_duplicate_names(tmp_path, b):
    p = tmp_path / "x.ovl"
    m = (info("record/provenance.jsonl"), b"")
    body = [meta_member(), m]
    write_tgz(p, manifest_of(body) + body + [m])
    refused(b, p, "appears twice")


def test_member_not_in_manifest_and_missing(tmp_path, b):
    p = tmp_path / "x.ovl"
    body = [meta_member()]
    extra = (info("record/provenance.jsonl"), b"")
    write_tgz(p, manifest_of(body) + body + [extra])
    refused(b, p, "not in the manifest")
    write_tgz(p, manifest_of(body + [extra]) + body)
    refused(b, p, "lacks")


def test_manifest_must_come_first(tmp_path, b):
    p = tmp_path / "x.ovl"
    body = [meta_member()]
    write_tgz(p, body + manifest_of(body))
    refused(b, p, "does not start with its manifest")


def test_type_size_and_mode_must_match_the_manifest(tmp_path, b):
    p = tmp_path / "x.ovl"
    body = [meta_member(state="pending"), (info("changes/tree/a", mode=0o644), b"aaa")]
    listing = manifest_of(body, state="pending")
    write_tgz(p, listing + [body[0], (info("changes/tree/a", mode=0o755), b"aaa")])
    refused(b, p, "mode")
    write_tgz(p, listing + [body[0], (info("changes/tree/a", "dir", mode=0o644), None)])
    refused(b, p, "manifest says file")
    write_tgz(p, listing + [body[0], (info("changes/tree/a", mode=0o644), b"aaaa")])
    refused(b, p, "bytes, the manifest says 3")


def test_object_not_named_by_its_hash(tmp_path, b):
    p = tmp_path / "x.ovl"
    crafted(p, [(info("objects/" + "a" * 64, mode=0o400), b"not that content")])
    refused(b, p, "not named by its content")


def test_meta_of_another_session(tmp_path, b):
    p = tmp_path / "x.ovl"
    body = [meta_member(sid="20261201-000000-111111")]
    write_tgz(p, manifest_of(body) + body)
    refused(b, p, "not this session")


def test_not_our_format(tmp_path, b):
    p = tmp_path / "x.ovl"
    body = [meta_member()]
    write_tgz(p, manifest_of(body, format="something-else") + body)
    refused(b, p, "not an OVERLORD bundle")
    write_tgz(p, manifest_of(body, version=99) + body)
    refused(b, p, "version 99")
    write_tgz(p, manifest_of(body, sid="../../etc") + body)
    refused(b, p, "no valid session id")


# -- signatures and tampering on a real bundle ---------------------------------------------------

@pytest.fixture
def real(tmp_path, target):
    """Machine a's bundle of a pending session, and machine b holding a's key."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    sid = session(a, target, "echo changed > hello.txt; echo new > new.txt; rm sub/a.txt")
    path = tmp_path / "a.ovl"
    export(a, sid, path)
    share_key(a, b, tmp_path)
    return a, b, sid, path


def rewrite(src, dst, edit_member=None, edit_manifest=None, sig=None, drop=()):
    """Rebuild a bundle, changing one member's bytes, the manifest, or the signature."""
    out = []
    for ti, data in read_bundle(src):
        if ti.name in drop:
            continue
        if edit_member and ti.name == edit_member[0]:
            data = edit_member[1](data)
        if ti.name == "manifest.json" and edit_manifest:
            data = edit_manifest(data)
        if ti.name == "manifest.sig" and sig is not None:
            data = sig
        out.append((ti, data))
    write_tgz(dst, out)


def test_intact_bundle_imports_verified(real, tmp_path):
    a, b, sid, path = real
    res = json.loads(b("import", path, "--require-signature", "--json", check=0).out)
    assert res["verified"] is True and res["sid"] == sid


def test_altered_member_refused(real, tmp_path):
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"
    rewrite(path, bad, edit_member=("changes/tree/new.txt", lambda d: b"NEW\n"))
    refused(b, bad, "altered")
    rewrite(path, bad, edit_member=("record/provenance.jsonl", lambda d: d.replace(b"hello", b"jello")))
    refused(b, bad, "altered")


def test_altered_member_refused_unverified_too(real, tmp_path):
    """Without the key the member hashes still hold: an altered member is refused."""
    a, b, sid, path = real
    c = machine(tmp_path, "c")
    bad = tmp_path / "bad.ovl"
    rewrite(path, bad, edit_member=("changes/tree/new.txt", lambda d: b"NEW\n"))
    refused(c, bad, "altered")


def test_edited_manifest_refused(real, tmp_path):
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"

    def edit(data):
        m = json.loads(data)
        m["members"]["changes/tree/new.txt"]["mode"] = 0o4755
        return json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    rewrite(path, bad, edit_manifest=edit)
    refused(b, bad, "altered or forged")


def test_manifest_resigned_with_another_key_refused(real, tmp_path):
    import hashlib
    import hmac
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"
    data = read_bundle(path)[0][1]                   # the manifest's bytes, as signed
    rewrite(path, bad, sig=hmac.new(os.urandom(32), data, hashlib.sha256).hexdigest().encode())
    refused(b, bad, "altered or forged")


def test_truncated_manifest_refused(real, tmp_path):
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"
    rewrite(path, bad, edit_manifest=lambda d: d[:len(d) // 2])
    refused(b, bad, "not JSON")
    c = machine(tmp_path, "c")                       # truncated is refused without a key too
    refused(c, bad, "not JSON")


def test_signature_removed_refused_where_the_key_is(real, tmp_path):
    """The manifest names b's key (shared): a bundle without its signature is tampered."""
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"
    rewrite(path, bad, drop=("manifest.sig",))
    refused(b, bad, "carries no signature")
    # where the key is not held, the same bundle is merely unverified
    c = machine(tmp_path, "c")
    res = json.loads(c("import", bad, "--json", check=0).out)
    assert res["verified"] is False


def test_forged_key_id_is_unverified_never_verified(real, tmp_path):
    """A forger who rewrites key_id (so the importer cannot check) gets `unverified`, which
    --require-signature refuses."""
    a, b, sid, path = real
    bad = tmp_path / "bad.ovl"

    def edit(data):
        m = json.loads(data)
        m["key_id"] = "0" * 32
        return json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    rewrite(path, bad, edit_manifest=edit)
    refused(b, bad, "unverified", flags=("--require-signature",))
    res = json.loads(b("import", bad, "--json", check=0).out)
    assert res["verified"] is False and "another key" in res["why"]


def test_key_file_checks(tmp_path, b):
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    proc = b("bundle", "key", "--import", bad)
    assert proc.returncode == 1 and "not a bundle key" in proc.err, proc.err
    assert not os.path.exists(os.path.join(b.home, "bundle.key"))
    bad.write_text("ab" * 31 + "\n")
    assert b("bundle", "key", "--import", bad).returncode == 1
    b("bundle", "key", check=0)                      # made now
    kp = os.path.join(b.home, "bundle.key")
    os.chmod(kp, 0o644)
    proc = b("bundle", "key")
    assert proc.returncode == 1 and "group/other" in proc.err, proc.err
    proc = b("export", "20261201-000000-abcdef", "-o", tmp_path / "x.ovl")
    assert proc.returncode != 0 and "Traceback" not in proc.err
    os.chmod(kp, 0o600)
    assert len(key_of(b)) == 32
