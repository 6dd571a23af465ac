"""Webhooks for the faces (`overlord webhooks ...`, Settings -> Notifications): the hooks that
tell a channel when an audited act happens, through overlord/trust/notify.py. Secrets are
never returned: a hook's `secret` reads None, "set", or the `secret://NAME` reference.
docs/WEBHOOKS.md."""
from overlord.trust import audit, notify

FORMATS = notify.FORMATS
DEFAULT_ON = notify.DEFAULT_ON
EVERY = "*"
ACTIONS = (*audit.ACTIONS, EVERY)     # what a hook's `on` may name: every audited act, or "*"


def webhook_add(name, url, fmt="slack", on=(), secret=None, allow_private=False):
    """Add a hook: {"name", "url", "host", "format", "on", "secret", "allow_private",
    "created"}. UsageError for a bad name, URL, format, act or secret; OverlordError when the
    name is taken. Audited webhook.add (without the secret)."""
    return notify.add(name, url, fmt=fmt, on=list(on or ()), secret=secret,
                      allow_private=bool(allow_private))


def webhook_list():
    """{"base_url", "hooks": [hook views as webhook_add returns, by name], "queued": N}."""
    return notify.listing()


def webhook_remove(name):
    """Remove a hook: {"name", "removed": True}; NotFound when there is none. Audited."""
    return notify.remove(name)


def webhook_test(name):
    """Send a test message to the hook now (one attempt, synchronously) and return the
    outcome {"ts", "hook", "id", "action", "host", "attempts", "ok", "status", "error", "test",
    ...}; it is also in the delivery log. NotFound when there is no such hook. Audited
    webhook.test."""
    return notify.test(name)


def webhook_base_url(url):
    """Set (a URL) or clear (None) the workspace address links point at: {"base_url"}.
    Audited webhook.base_url."""
    return notify.set_base_url(url)


def webhook_deliveries(limit=50):
    """The last `limit` delivery outcomes, newest first (the same dicts webhook_test returns)."""
    return notify.deliveries(limit)
