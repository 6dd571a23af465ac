"""The audit chain's operations, as every face offers them: verify (with a pin or the
witness), show, where the key is, checkpoint, the witness config and the reference receiver."""
import json
import os

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path
from overlord.trust import audit, witness
from overlord.txn import store


def acting_as(who):
    """`with acting_as("account:<name>"):` -- the audit lines appended within the block (this
    thread, and what it hands its context to: the launcher's worker too) name that account as
    their actor; None keeps the OS user (overlord.trust.audit.acting_as, for the faces)."""
    return audit.acting_as(who)


def read_pin(path):
    """A pin file's {seq, hash}; anything else is a usage error naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"pin {escape_path(path)}: no such file") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"pin {escape_path(path)}: not JSON ({exc})") from None
    try:
        seq, digest = audit.check_head(data, f"pin {escape_path(path)}")
    except OverlordError as exc:
        raise UsageError(str(exc)) from None
    return {"seq": seq, "hash": digest}


def audit_verify(pin=None, use_witness=False):
    """The verify report (audit.verify's dict); pin: a pin file's path; use_witness: also
    check the head the configured witness holds (a witness that does not answer raises)."""
    pinned = read_pin(pin) if pin else None
    held, url = None, None
    if use_witness:
        url = witness.resolve_url(None)
        held = witness.fetch(url)
    report = audit.verify(pin=pinned, witness=held)
    if report["witness"] is not None:
        report["witness"]["url"] = url
    return report


def audit_status():
    """The chain's state for doctor: the verify report, or {"error": what} when the key or the
    log cannot be read."""
    try:
        return audit.verify()
    except OverlordError as exc:
        return {"error": str(exc)}


def audit_show(since=None, action=None):
    """The log's entries (seq >= since; action exact or a noun), oldest first."""
    if since is not None and (type(since) is not int or since < 0):
        raise UsageError(f"--since must be a seq (a number >= 0): {since!r}")
    return audit.entries(since=since, action=action)


def audit_key():
    """Where the key is and whether it exists yet: {"path", "exists", "log"}."""
    key = audit.load_key()          # a bad key raises, naming the file
    return {"path": audit.key_path(), "exists": key is not None, "log": audit.log_path()}


def audit_checkpoint(path=None, send=False):
    """Record an audit.checkpoint act and return the head that includes it ({"seq", "hash"});
    path: also write it there as a pin file; send: POST the signed head to the witness
    (added as "sent": the witness URL)."""
    url = witness.resolve_url(None) if send else None     # no witness configured: refuse before the act
    head = audit.checkpoint()
    if path:
        store.write_json_atomic(os.path.abspath(path), head, mode=0o644)
    out = dict(head)
    if send:
        witness.send(url)
        out["sent"] = url
    return out


def audit_witness(url=None, auto=False):
    """Configure the witness (url given) or read the config; returns {"url", "auto",
    "last_sent"} or None when none is configured."""
    conf = witness.configure(url, auto) if url is not None else witness.load_config()
    if conf is None:
        return None
    return dict(conf, last_sent=witness.last_sent() or None)


def audit_witness_serve(bind, store_path, key_file=None, on_ready=None):
    """Run the reference receiver until interrupted. on_ready(url) is told where it listens.
    key_file: a copy of the audit key, to refuse heads whose mac does not verify."""
    key = audit.load_key(os.path.abspath(key_file)) if key_file else None
    if key_file and key is None:
        raise OverlordError(f"audit key {escape_path(key_file)}: no such file")
    server = witness.make_server(bind, store_path, key)
    host, port = server.server_address[:2]
    if on_ready:
        on_ready(f"http://{host}:{port}/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
