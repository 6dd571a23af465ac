"""Policy and recorded egress: NETS is none < proxy < host, and a net_allow cap on a proxy
session's allowlist (refusals name the rule; an unasked allowlist takes the cap)."""
import json

import pytest

from conftest import Ovl

from overlord.errors import OverlordError
from overlord.trust import policy as P


def put(home, data):
    (home / "policy.json").write_text(json.dumps(data))


def test_nets_order_tightest_first():
    assert P.NETS == ("none", "proxy", "host")


@pytest.mark.parametrize("asked,ok", [("none", True), ("proxy", True), ("host", False)])
def test_net_proxy_allows_none_and_proxy_refuses_host(home, tmp_path, asked, ok):
    put(home, {"default": {"net": "proxy"}})
    if ok:
        assert P.cap_grants(str(tmp_path), {"net": asked})["net"] == asked
    else:
        with pytest.raises(OverlordError) as exc:
            P.cap_grants(str(tmp_path), {"net": asked})
        assert str(exc.value) == ("policy default allows at most net: proxy; this request "
                                  "asked for net: host")


def test_net_none_refuses_proxy(home, tmp_path):
    put(home, {"default": {"net": "none"}})
    with pytest.raises(OverlordError, match="allows at most net: none; this request asked for net: proxy"):
        P.cap_grants(str(tmp_path), {"net": "proxy"})


def test_unasked_net_takes_the_tighter_of_default_and_policy(home, tmp_path):
    put(home, {"default": {"net": "proxy"}})
    assert P.cap_grants(str(tmp_path), {})["net"] == "proxy"
    assert P.cap_grants(str(tmp_path), {}, {"net": "none"})["net"] == "none"
    assert P.cap_grants(str(tmp_path), {}, {"net": "host"})["net"] == "proxy"


def test_net_allow_cap_bounds_entries(home, tmp_path):
    t = str(tmp_path)
    put(home, {"targets": {t: {"net_allow": ["*.pypi.org", "github.com", "10.0.0.5"]}}})
    ok = {"net": "proxy", "net_allow": ["files.pypi.org", "*.a.pypi.org", "github.com", "10.0.0.5"]}
    assert P.cap_grants(t, ok)["net_allow"] == ok["net_allow"]
    for entry in ("pypi.org", "evil.com", "*.org", "api.github.com", "10.0.0.6", "127.0.0.1"):
        with pytest.raises(OverlordError) as exc:
            P.cap_grants(t, {"net": "proxy", "net_allow": ["github.com", entry]})
        assert str(exc.value) == (f"policy targets[{t}] caps net_allow at *.pypi.org, github.com, "
                                  f"10.0.0.5; this request asked for net_allow: {entry}")


def test_proxy_session_without_allowlist_under_a_cap_gets_the_cap(home, tmp_path):
    put(home, {"default": {"net_allow": ["*.pypi.org"]}})
    assert P.cap_grants(str(tmp_path), {"net": "proxy"})["net_allow"] == ["*.pypi.org"]
    # the default path too: the network came from the caller's defaults
    assert P.cap_grants(str(tmp_path), {}, {"net": "proxy"})["net_allow"] == ["*.pypi.org"]
    # other networks are the net key's business; no allowlist is added to them
    assert "net_allow" not in P.cap_grants(str(tmp_path), {"net": "none"})
    assert "net_allow" not in P.cap_grants(str(tmp_path), {"net": "host"})


def test_a_session_opened_wider_than_todays_cap_is_refused_at_its_next_command(home, tmp_path):
    t = str(tmp_path)
    put(home, {"default": {"net_allow": ["a.example"]}})
    P.hold(t, {"net": "proxy", "net_allow": ["a.example"]}, sid="S")
    for grants, says in (({"net": "proxy", "net_allow": ["b.example"]}, "net_allow: b.example"),
                         ({"net": "proxy"}, "no net_allow (every public host)")):
        with pytest.raises(OverlordError) as exc:
            P.hold(t, grants, sid="S")
        assert str(exc.value).startswith(f"policy default caps net_allow at a.example; session S "
                                         f"was opened with {says}; roll it back")


@pytest.mark.parametrize("value,says", [
    ("pypi.org", "default.net_allow must be a list of host names"),
    ([], "default.net_allow must name at least one host"),
    (["http://x"], "default.net_allow: allowlist entry 'http://x' is not a host name"),
    ([""], "default.net_allow: an empty allowlist entry"),
    (["a*.b"], "default.net_allow: allowlist entry 'a*.b': a wildcard is only allowed"),
])
def test_a_bad_cap_is_refused_naming_the_key(home, tmp_path, value, says):
    put(home, {"default": {"net_allow": value}})
    proc = Ovl(home)("policy", "check")
    assert proc.returncode == 1 and proc.out == ""
    assert proc.err.startswith(f"overlord: policy {home / 'policy.json'}: {says}"), proc.err
    assert len(proc.err.splitlines()) == 1


def test_cli_refusals_name_the_policy(home, target):
    put(home, {"default": {"net": "proxy", "net_allow": ["*.example.org"]}})
    ovl = Ovl(home, "kernel")
    for flags, says in ((["--net", "host"], "policy default allows at most net: proxy; this request "
                                            "asked for net: host"),
                        (["--net", "proxy", "--net-allow", "example.com"],
                         "policy default caps net_allow at *.example.org; this request asked for "
                         "net_allow: example.com")):
        proc = ovl("run", "-t", target, *flags, "--", "true")
        assert proc.returncode == 1 and proc.err == f"overlord: {says}\n", proc.err
    assert not (home / "sessions").exists() or not list((home / "sessions").iterdir())


def test_policy_show_lists_the_cap(home, target):
    put(home, {"default": {"net_allow": ["*.pypi.org", "pypi.org"]}})
    data = json.loads(Ovl(home)("policy", "show", "-t", target, "--json", check=0).out)
    assert data["rule"]["net_allow"] == ["*.pypi.org", "pypi.org"]
    assert data["sources"]["net_allow"] == "default"
