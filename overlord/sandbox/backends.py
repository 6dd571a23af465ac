"""Choosing a backend: kernel preferred, fuse as the labelled fallback."""
import os

from overlord.errors import OverlordError, UsageError
from overlord.sandbox import fuse, kernel

BACKENDS = {"kernel": kernel, "fuse": fuse}


_pinned = {}


def pin(results):
    """From now on answer probes in this process from `results` ({name: (available, reason)}).
    Probing clones, and a threaded server must not clone (ops.execute.launcher): its
    single-threaded helper probes once at start-up and the server pins the answers here."""
    _pinned.update(results)


def probe(name):
    """(available, reason) of one backend: pinned, or probed now."""
    return _pinned[name] if name in _pinned else BACKENDS[name].probe()


def probe_all():
    """{name: (available, reason)} for every backend."""
    return {name: probe(name) for name in BACKENDS}


def choose(requested=None):
    """The backend module to use: the one asked for, OVERLORD_TEST_BACKEND, or the first
    available (kernel before fuse). Refuses with the reason when none can mount."""
    requested = requested or os.environ.get("OVERLORD_TEST_BACKEND") or None
    if requested:
        if requested not in BACKENDS:
            raise UsageError(f"unknown backend {requested!r} (choose kernel or fuse)")
        ok, why = probe(requested)
        if not ok:
            raise OverlordError(f"{requested} backend unavailable: {why}")
        return BACKENDS[requested]
    reasons = []
    for name, mod in BACKENDS.items():
        ok, why = probe(name)
        if ok:
            return mod
        reasons.append(f"{name}: {why}")
    raise OverlordError("no backend can mount here (" + "; ".join(reasons) + ")")


def get(name):
    return BACKENDS[name]
