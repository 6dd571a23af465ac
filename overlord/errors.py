"""One error family for every layer: lower layers raise, only faces exit or answer."""


class OverlordError(Exception):
    """A refusal: the request was understood and declined (exit 1, HTTP 409 unless told)."""

    exit_code = 1
    http_status = 409

    def __init__(self, message, *, http_status=None):
        super().__init__(message)
        if http_status is not None:
            self.http_status = http_status


class UsageError(OverlordError):
    """The request itself is malformed (exit 2, HTTP 400)."""

    exit_code = 2
    http_status = 400


class NotFound(OverlordError):
    http_status = 404


class Denied(OverlordError):
    """Refused by policy for a brokered caller (the daemon, the MCP server, a harness hook):
    the message names the policy file and the key that would allow it (exit 1, HTTP 403)."""

    http_status = 403


class Conflict(OverlordError):
    """Commit refused: the real tree changed under the session (drift)."""

    http_status = 409


class LaunchError(OverlordError):
    """The sandbox could not be set up; nothing ran and nothing was left behind."""

    http_status = 500
