"""Red team, issue 16, the web face: the new routes (usage meter, Settings -> Notifications,
a session's export) behind the existing Guard. A page an agent serves on another loopback
port rides the launch cookie (SameSite ignores ports): every route that changes something
must refuse it, and the export (a file signed with this machine's bundle key) must not be
handed to another origin. Runs a real `overlord ui`."""
import json
import os

import pytest

from conftest import Ovl, SESSION_RE
from weblib import UI, ui  # noqa: F401


def launch_cookie(server):
    r = server.get("/?token=" + server.token, auth=False)
    raw = r.header("set-cookie")
    assert raw, (r.status, r.headers)
    return raw.split(";")[0]


def as_cookie(server, method, path, body=None, origin=None, site=None):
    h = {"Cookie": launch_cookie(server)}
    if origin is not None:
        h["Origin"] = origin
    if site is not None:
        h["Sec-Fetch-Site"] = site
    return server.request(method, path, body=body, headers=h, auth=False)


HOOK = {"name": "csrf", "url": "https://example.com/hook", "format": "json", "on": ["*"]}
CHANGES = [("POST", "/api/webhooks", HOOK), ("PUT", "/api/webhooks/base-url", {"url": "https://evil.example"}),
           ("DELETE", "/api/webhooks/keep", None), ("POST", "/api/webhooks/keep/test", {})]


@pytest.mark.parametrize("method,path,body", CHANGES)
def test_notification_changes_refuse_another_origin(ui, method, path, body):
    ui.ok("POST", "/api/webhooks", {"name": "keep", "url": "https://example.com/k"})
    before = ui.ok("GET", "/api/webhooks")
    other = f"http://127.0.0.1:{ui.port + 1}"
    for origin, site in ((other, None), (None, "same-site"), (None, "cross-site"), ("null", None),
                         (None, None)):
        r = as_cookie(ui, method, path, body, origin=origin, site=site)
        assert r.status == 403, (method, path, origin, site, r.status, r.body)
    assert ui.ok("GET", "/api/webhooks") == before
    # the positive control: the same request from this very page is accepted
    r = as_cookie(ui, method, path, body, origin=ui.base)
    assert r.status < 400 or r.status == 404, (r.status, r.body)


def test_webhook_listing_never_carries_the_secret(ui):
    secret = "web-secret-" + os.urandom(6).hex()
    ui.ok("POST", "/api/webhooks", dict(HOOK, secret=secret))
    for path in ("/api/webhooks", "/api/webhooks/deliveries"):
        r = ui.get(path)
        assert r.status == 200 and secret.encode() not in r.body, path
    r = ui.post("/api/webhooks/csrf/test", {})
    assert secret.encode() not in r.body


def test_export_is_not_handed_to_another_origin(ui, home, target):
    sid = SESSION_RE.search(Ovl(home)("run", "-t", target, "--", "sh", "-c", "echo x > a.txt",
                                      check=0).out).group(1)
    path = f"/api/session/{sid}/export"
    for site in ("cross-site", "same-site"):
        r = as_cookie(ui, "GET", path, site=site)
        assert r.status == 403, (site, r.status, r.body[:200])
    r = as_cookie(ui, "GET", path, site="same-origin")
    assert r.status == 200 and r.body[:2] == b"\x1f\x8b"
    disp = r.header("content-disposition") or ""
    assert disp.startswith("attachment") and f"{sid}.ovl" in disp and "\r" not in disp, disp
    assert (r.header("content-type") or "").startswith("application/")
    assert r.header("x-content-type-options") == "nosniff"


@pytest.mark.parametrize("bad", ["..%2F..%2Fetc", "20261201-000000-abcdef%0A",
                                 "20261201-000000-abcdef%0D%0ASet-Cookie:%20x=1",
                                 "20261201-000000-ABCDEF"])
def test_export_of_a_malformed_sid_is_a_clean_4xx(ui, bad):
    r = ui.get(f"/api/session/{bad}/export")
    assert 400 <= r.status < 500, (r.status, r.body[:200])
    assert "set-cookie" not in r.headers and b"Traceback" not in r.body


def test_usage_meter_says_so_rather_than_inventing(ui):
    r = ui.ok("GET", "/api/usage")
    assert r["rate"] == {} or all(isinstance(v, dict) for v in r["rate"].values())
    for period in ("day", "month"):
        assert r["spend"][period]["limit"] is None
