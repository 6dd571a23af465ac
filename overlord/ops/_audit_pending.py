"""TEMPORARY stand-in while overlord.trust.audit is being written (removed this session)."""


def ready():
    pass


def append(action, **fields):
    return {"seq": 0, "action": action}
