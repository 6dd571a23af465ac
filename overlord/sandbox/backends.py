"""Choosing a backend: kernel preferred, fuse as the labelled fallback."""
import os

from overlord.errors import OverlordError, UsageError
from overlord.sandbox import fuse, kernel

BACKENDS = {"kernel": kernel, "fuse": fuse}


def probe_all():
    """{name: (available, reason)} for every backend."""
    return {name: mod.probe() for name, mod in BACKENDS.items()}


def choose(requested=None):
    """The backend module to use: the one asked for, OVERLORD_TEST_BACKEND, or the first
    available (kernel before fuse). Refuses with the reason when none can mount."""
    requested = requested or os.environ.get("OVERLORD_TEST_BACKEND") or None
    if requested:
        if requested not in BACKENDS:
            raise UsageError(f"unknown backend {requested!r} (choose kernel or fuse)")
        ok, why = BACKENDS[requested].probe()
        if not ok:
            raise OverlordError(f"{requested} backend unavailable: {why}")
        return BACKENDS[requested]
    reasons = []
    for name, mod in BACKENDS.items():
        ok, why = mod.probe()
        if ok:
            return mod
        reasons.append(f"{name}: {why}")
    raise OverlordError("no backend can mount here (" + "; ".join(reasons) + ")")


def get(name):
    return BACKENDS[name]
