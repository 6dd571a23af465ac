"""Secrets from a vault for the faces (`overlord secrets ...`): overlord/trust/vault.py through
the service layer. docs/VAULT.md."""
from overlord.trust import vault


def secrets_set_command(cmd, ttl=None):
    """Configure the resolver command ('CMD ... {name} ...', parsed with shlex, run without a
    shell); ttl seconds a value is cached in memory (default 300, 0 = never). Audited
    secret.config (program name and argument count only). Returns secrets_show()."""
    return vault.set_command(cmd, ttl=ttl)


def secrets_show():
    """{"configured", "path", "command", "program", "ttl"} -- the command as stored (it is
    the caller's own 0600 file; a face serving others shows only `program`)."""
    return vault.show()


def secrets_test(name):
    """Resolve `name` now (never from the cache) and say how long the secret is:
    {"name", "length"} -- never the value. Audited secret.resolve like any use."""
    value = vault.fetch(vault.check_name(name), "secrets test", fresh=True)
    return {"name": name, "length": len(value)}


def secrets_off():
    """Remove the resolver; True when one was set. References stop resolving (a clean error
    naming each) until a command is set again."""
    return vault.off()
