"""Layer dialects and stacking, on synthetic layer directories (no mounts)."""
import os
import stat

from overlord.txn import changes as C
from overlord.txn import layers as L


def whiteout(path):
    os.mknod(path, stat.S_IFCHR | 0o600, 0)


def test_kernel_dialect_whiteouts_and_opaque(tmp_path):
    layer = tmp_path / "layer"
    (layer / "d").mkdir(parents=True)
    whiteout(layer / "gone")
    (layer / ".wh.x").write_text("an ordinary file on the kernel backend")
    os.setxattr(layer / "d", "user.overlay.opaque", b"y")
    entries = L.read_layer(str(layer), "kernel")
    assert entries["gone"].kind == "whiteout"
    assert entries[".wh.x"].kind == "file"
    assert entries["d"].kind == "dir" and entries["d"].opaque


def test_fuse_dialect_reads_only_the_markers_fuse_overlayfs_writes(tmp_path):
    layer = tmp_path / "layer"
    (layer / "new").mkdir(parents=True)
    os.setxattr(layer / "new", "user.fuseoverlayfs.opaque", b"y")   # a command cannot set this
    (layer / "new" / ".wh..wh..opq").write_text("")
    whiteout(layer / "new" / ".wh..opq")
    (layer / "new" / "f").write_text("f")
    whiteout(layer / "removed")
    # names a command can make through the mount: never whiteouts or opaque marks
    (layer / ".wh.important").write_text("")
    (layer / "d").mkdir()
    os.setxattr(layer / "d", "user.overlay.opaque", b"y")
    (layer / "d" / ".wh..wh..opq").write_text("")
    (layer / ".wh.dir").mkdir()
    os.symlink("x", layer / ".wh.sym")
    os.mkfifo(layer / ".wh.fifo")
    entries = L.read_layer(str(layer), "fuse")
    assert set(entries) == {"", "new", "new/f", "removed", ".wh.important", "d",
                            "d/.wh..wh..opq", ".wh.dir", ".wh.sym", ".wh.fifo"}
    assert entries["new"].opaque and not entries["d"].opaque
    assert entries["removed"].kind == "whiteout"
    for name in (".wh.important", "d/.wh..wh..opq", ".wh.dir", ".wh.sym", ".wh.fifo"):
        assert entries[name].kind == "invalid", name
    # fuse-overlayfs hides user.overlay.* from the command yet reads user.overlay.opaque as a
    # mark on the next mount: not content, and forged (commit refuses it)
    assert entries["d"].xattrs == {} and entries["d"].forged == ["user.overlay.opaque"]
    assert entries["new"].xattrs == {} and entries["new"].forged == []  # fuse-overlayfs's mark


def test_fuse_whiteout_naming_root_is_invalid(tmp_path):
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / ".wh..").write_text("")
    entries = L.read_layer(str(layer), "fuse")
    assert entries[".wh.."].kind == "invalid"


def test_stack_top_layer_wins_and_whiteouts_hide(tmp_path):
    low, high = tmp_path / "0", tmp_path / "1"
    (low / "d").mkdir(parents=True)
    (low / "d" / "x").write_text("low")
    (low / "keep").write_text("low")
    high.mkdir()
    whiteout(high / "d")
    (high / "keep").write_text("high")
    view = L.stack([L.read_layer(str(low), "kernel", 0), L.read_layer(str(high), "kernel", 1)])
    assert set(view) == {"", "d", "keep"}
    assert view["d"].kind == "whiteout" and view["keep"].layer == 1


def test_resolve_sees_through_layers_to_the_real_tree(tmp_path):
    low, high = tmp_path / "0", tmp_path / "1"
    (low / "a").mkdir(parents=True)
    (low / "a" / "f").write_text("x")
    high.mkdir()
    whiteout(high / "gone")
    dirs = [str(high), str(low)]
    assert L.resolve("a/f", dirs, "kernel")[0] == 1
    assert L.resolve("gone", dirs, "kernel") == (None, None)
    assert L.resolve("elsewhere", dirs, "kernel") == ("real", None)


def test_plan_kinds_against_a_real_tree(tmp_path):
    real, layer = tmp_path / "real", tmp_path / "layer"
    (real / "dir").mkdir(parents=True)
    (real / "dir" / "old").write_text("old")
    (real / "same").write_text("same")
    (real / "file").write_text("before")
    layer.mkdir()
    (layer / "file").write_text("after")
    (layer / "new").write_text("new")
    (layer / "dir").mkdir()
    os.setxattr(layer / "dir", "user.overlay.opaque", b"y")
    whiteout(layer / "same")
    view = L.stack([L.read_layer(str(layer), "kernel", 0)])
    kinds = {c.path: c.kind for c in C.plan(view, str(real))}
    assert kinds == {"file": "modified", "new": "added", "dir": "replaced-dir", "same": "deleted"}


def test_a_copied_up_dir_keeps_replacing_what_a_lower_layer_replaced(tmp_path):
    # layer 0 made x a directory over a file (opaque); layer 1 wrote inside it (a plain copy-up)
    low, high = tmp_path / "0", tmp_path / "1"
    (low / "x").mkdir(parents=True)
    os.setxattr(low / "x", "user.overlay.opaque", b"y")
    (low / "x" / "i").write_text("i")
    (high / "x").mkdir(parents=True)
    (high / "x" / "j").write_text("j")
    view = L.stack([L.read_layer(str(low), "kernel", 0), L.read_layer(str(high), "kernel", 1)])
    assert view["x"].layer == 1 and view["x"].opaque
    assert set(view) == {"", "x", "x/i", "x/j"}


def test_hard_links_split_across_layers_are_found(tmp_path):
    low, high = tmp_path / "0", tmp_path / "1"
    low.mkdir()
    high.mkdir()
    (low / "a").write_text("one")
    os.link(low / "a", low / "b")
    (low / "solo").write_text("s")
    (high / "a").write_text("two")            # a copy-up of one name of the pair
    layers = [L.read_layer(str(low), "fuse", 0), L.read_layer(str(high), "fuse", 1)]
    assert L.split_links(layers, L.stack(layers)) == ["a", "b"]
    only_low = layers[:1]
    assert L.split_links(only_low, L.stack(only_low)) == []


def test_xattrs_are_content_but_overlay_bookkeeping_is_not(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    os.setxattr(f, "user.k", b"1")
    os.setxattr(f, "user.overlay.origin", b"o")
    os.setxattr(f, "user.fuseoverlayfs.x", b"o")
    assert L.xattrs(str(f), "kernel") == {"user.k": b"1", "user.fuseoverlayfs.x": b"o"}
    assert L.xattrs(str(f), "fuse") == {"user.k": b"1"}
    os.setxattr(f, "user.overlay.overlay.opaque", b"y")      # how the kernel stores a forged one
    assert L._read_xattrs(str(f), "kernel")[1] == ["user.overlay.overlay.opaque"]
    assert L._read_xattrs(str(f), "fuse")[1] == ["user.overlay.origin", "user.overlay.overlay.opaque"]
    L.sync_xattrs(str(f), {"user.new": b"2"}, "kernel")
    assert L.xattrs(str(f), "kernel") == {"user.new": b"2"}
    assert os.getxattr(f, "user.overlay.origin") == b"o"     # never touched


def test_acl_naming_another_principal_is_privileged():
    def acl(*entries):
        return (2).to_bytes(4, "little") + b"".join(
            t.to_bytes(2, "little") + p.to_bytes(2, "little") + i.to_bytes(4, "little")
            for t, p, i in entries)
    owner_only = acl((0x01, 6, 0xFFFFFFFF), (0x04, 4, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF))
    named = acl((0x01, 6, 0xFFFFFFFF), (0x02, 6, 65534), (0x04, 4, 0xFFFFFFFF),
                (0x10, 6, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF))
    assert not C.acl_grants_others(owner_only)
    assert C.acl_grants_others(named)
    assert C.acl_grants_others(b"garbage")


def test_refusals_below_a_replaced_dir_are_not_skipped(tmp_path, monkeypatch):
    """An invalid whiteout or a forged overlay xattr under a directory that replaces a real
    non-directory is still refused (it is checked before the 'goes with its parent' skip)."""
    from overlord.txn import commit as K

    monkeypatch.setenv("OVERLORD_HOME", str(tmp_path / "home"))
    target, layer = tmp_path / "t", tmp_path / "0"
    target.mkdir()
    os.mkfifo(target / "x")                       # the session made x a directory
    (layer / "x").mkdir(parents=True)
    os.setxattr(layer / "x", "user.fuseoverlayfs.opaque", b"y")
    (layer / "x" / ".wh.y").write_text("")
    (layer / "x" / "f").write_text("f")
    os.setxattr(layer / "x" / "f", "user.overlay.whiteout", b"y")
    view = L.stack([L.read_layer(str(layer), "fuse", 0)])

    class S:
        meta = {"open_stamp_ns": 0}
        target = str(tmp_path / "t")
        dialect = "fuse"

        def base(self, records=None):
            return {}

        def restored(self):
            return {}
    reasons = {d.path: d.reason for d in K.check_drift(S(), view, [])}
    assert reasons["x/.wh.y"] == "invalid whiteout"
    assert reasons["x/f"].startswith(K.FORGED)
