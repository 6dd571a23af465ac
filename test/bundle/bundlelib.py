"""Two machines in one test (two OVERLORD_HOMEs), and hand-built bundles for the hostile cases."""
import gzip
import hashlib
import hmac
import io
import json
import os
import stat
import tarfile

from conftest import Ovl, SESSION_RE


def machine(tmp_path, name, backend=None):
    home = tmp_path / name
    home.mkdir()
    return Ovl(home, backend)


def session(ovl, target, script):
    """Run script in a new pending session on target; returns its sid."""
    proc = ovl("run", "-t", target, "--", "sh", "-c", script, check=0)
    m = SESSION_RE.search(proc.out)
    assert m, proc.out
    return m.group(1)


def export(ovl, sid, out):
    proc = ovl("export", sid, "-o", out, "--json", check=0)
    return json.loads(proc.out)


def share_key(src, dst, tmp_path):
    """Install machine src's bundle key on dst (as a person would copy it)."""
    path = src("bundle", "key", "--show-path", check=0).out.strip()
    copy = tmp_path / "shared.key"
    copy.write_bytes(open(path, "rb").read())
    dst("bundle", "key", "--import", copy, check=0)


def key_of(ovl):
    path = os.path.join(ovl.home, "bundle.key")
    return bytes.fromhex(open(path).read().strip())


def fingerprint(key):
    return hashlib.sha256(b"overlord bundle key\n" + key).hexdigest()[:32]


def read_bundle(path):
    """[(TarInfo, bytes or None)] of a bundle, in order."""
    out = []
    with tarfile.open(path, "r:gz") as tar:
        for ti in tar:
            data = tar.extractfile(ti).read() if ti.isreg() else None
            out.append((ti, data))
    return out


def write_tgz(path, members, raw=False):
    """Write [(TarInfo, bytes or None)] as a tar.gz (raw: the tar bytes uncompressed)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            else:
                tar.addfile(ti)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data if raw else gzip.compress(data))


def info(name, kind="file", mode=0o644, link=None, size=0, **kw):
    ti = tarfile.TarInfo(name)
    ti.mode = mode
    ti.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
               "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE,
               "fifo": tarfile.FIFOTYPE}[kind]
    if link is not None:
        ti.linkname = link
    ti.size = size
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def manifest_of(members, sid="20261201-000000-abcdef", key=None, state="committed", **extra):
    """A manifest listing members [(TarInfo, bytes)] exactly, signed with key (or unsigned):
    a crafted bundle whose only flaw is the one the test put in."""
    listing = {}
    for ti, data in members:
        kind = "file" if ti.isreg() else "dir" if ti.isdir() else "symlink" if ti.issym() else "other"
        entry = {"type": kind, "mode": ti.mode & 0o7777, "size": len(data) if data is not None else 0,
                 "sha256": hashlib.sha256(data).hexdigest() if data is not None else None}
        if ti.issym():
            entry["sha256"] = hashlib.sha256(os.fsencode(ti.linkname)).hexdigest()
            entry["link"] = ti.linkname
            entry["mode"] = 0o777
        listing[ti.name] = entry
    manifest = {"format": "overlord-bundle", "version": 1, "sid": sid, "exported_at": 1.0,
                "host": "crafted", "state": state, "target": "/nowhere", "task": None,
                "key_id": fingerprint(key) if key else None, "changes": False,
                "members": listing}
    manifest.update(extra)
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    out = [(info("manifest.json", mode=0o600), data)]
    if key is not None:
        out.append((info("manifest.sig", mode=0o600), hmac.new(key, data, "sha256").hexdigest().encode()))
    return out


def meta_member(sid="20261201-000000-abcdef", state="committed", target="/nowhere"):
    data = json.dumps({"sid": sid, "state": state, "target": target, "layers": [],
                       "backend": "kernel", "created": 1.0}).encode()
    return (info("record/meta.json", mode=0o600), data)


def crafted(path, members, key=None, state="committed", **extra):
    """A bundle of a valid meta plus members, with a manifest listing them all."""
    body = [meta_member(state=state)] + list(members)
    write_tgz(path, manifest_of(body, key=key, state=state, **extra) + body)


def snapshot(root):
    """{relative path: (type, mode, bytes or link text)} of a tree, the root included."""
    out = {".": ("dir", stat.S_IMODE(os.lstat(root).st_mode), None)}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(base, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", None, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), None)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return out


def audit_lines(ovl, action=None):
    path = os.path.join(ovl.home, "audit.jsonl")
    try:
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except FileNotFoundError:
        return []
    return [x for x in lines if action is None or x.get("action") == action]


def untouched_store(ovl):
    """What a refused import must leave: no session, no object, no staging leftovers."""
    home = str(ovl.home)
    sessions = os.listdir(os.path.join(home, "sessions")) if os.path.isdir(os.path.join(home, "sessions")) else []
    assert sessions == [], sessions
    assert not os.path.exists(os.path.join(home, "objects")) or not any(
        files for _, _, files in os.walk(os.path.join(home, "objects")))
    staging = os.path.join(home, "bundle-tmp")
    assert not os.path.isdir(staging) or os.listdir(staging) == []
    assert audit_lines(ovl, "bundle.import") == []
