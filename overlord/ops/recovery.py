"""Settling a commit a crash interrupted, first thing in every command.

Every overlord command calls recover() before anything else, so when no journal is waiting it
costs one listdir and imports none of the commit machinery (ops.decide holds the recovery
itself)."""
import os

from overlord.txn import store


def recover():
    """Undo, or finish the bookkeeping of, any commit a crash interrupted (ops.decide)."""
    try:
        if not os.listdir(store.journal_dir()):
            return
    except FileNotFoundError:
        return
    from overlord.ops.decide import recover as settle
    settle()
