"""overlord/sandbox/netallow.py: allowlist entries, matching, caps and the address guard."""
import socket

import pytest

from overlord.sandbox import netallow as na


@pytest.mark.parametrize("entry, want", [
    ("pypi.org", "pypi.org"), ("PyPI.org.", "pypi.org"), ("*.pypi.org", "*.pypi.org"),
    ("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("[::1]", "::1"), ("0:0::1", "::1"),
    ("localhost", "localhost"), ("a-b.c9.example", "a-b.c9.example"),
])
def test_entries_normalise(entry, want):
    assert na.parse_entry(entry) == want


@pytest.mark.parametrize("entry, says", [
    ("", "empty"), ("   ", "empty"), (" pypi.org", "white space"), ("py pi.org", "white space"),
    ("*", "wildcard"), ("*pypi.org", "wildcard"), ("a.*.org", "wildcard"), ("*.", "wildcard"),
    ("*.-bad.org", "after '*.'"), ("http://pypi.org", "not a host name"),
    ("pypi.org:443", "not a host name"), ("pypi.org/simple", "not a host name"),
    ("user@pypi.org", "not a host name"), ("-x.org", "not a host name"),
    ("a..b", "not a host name"), ("x" * 64 + ".org", "not a host name"),
    ("évil.org", "not a host name"), ("a\x1b[31m.org", "not a host name"),
])
def test_bad_entries_say_what_is_wrong(entry, says):
    with pytest.raises(ValueError) as e:
        na.parse_entry(entry)
    assert says in str(e.value)
    assert "\x1b" not in str(e.value)        # shown with repr: no raw control bytes


def test_non_strings_and_lists():
    with pytest.raises(ValueError, match="must be a string"):
        na.parse_entry(5)
    with pytest.raises(ValueError, match="must be a list"):
        na.parse("pypi.org")
    with pytest.raises(ValueError, match="at most"):
        na.parse([f"h{i}.org" for i in range(na.MAX_ENTRIES + 1)])
    assert na.parse(["A.org", "a.org", "*.b.org"]) == ["a.org", "*.b.org"]


def test_matching_exact_and_below_a_suffix_only():
    allow = na.parse(["github.com", "*.pypi.org"])
    assert na.permits("github.com", allow) and na.permits("GitHub.com.", allow)
    assert not na.permits("api.github.com", allow)            # exact names are exact
    assert na.permits("files.pypi.org", allow) and na.permits("a.b.pypi.org", allow)
    assert not na.permits("pypi.org", allow)                  # not the suffix itself
    assert not na.permits("evilpypi.org", allow) and not na.permits("pypi.org.evil", allow)
    assert na.permits("anything.example", [])                 # no list: recorded, not refused


def test_named_is_exact_and_caps():
    allow = na.parse(["localhost", "*.internal"])
    assert na.named("LOCALHOST.", allow) and not na.named("db.internal", allow)
    cap = na.parse(["*.pypi.org", "github.com"])
    assert na.within("files.pypi.org", cap) and na.within("*.x.pypi.org", cap)
    assert na.within("*.pypi.org", cap) and na.within("github.com", cap)
    assert not na.within("pypi.org", cap) and not na.within("*.org", cap)
    assert not na.within("1.2.3.4", cap)


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("0.0.0.0", "unspecified"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("100.64.0.1", "CGNAT"),
    ("fd00::1", "ULA"), ("::ffff:127.0.0.1", "loopback (embedded in ::ffff:7f00:1)"),
    ("224.0.0.1", "multicast"), ("not-an-ip", "not an address"),
])
def test_blocked_addresses(address, why):
    assert na.blocked(address) == why


def test_public_addresses_pass():
    assert na.blocked("93.184.216.34") is None and na.blocked("2606:2800:220:1::1") is None


def fake_dns(table):
    def getaddrinfo(host, port, type=0):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in table[host]]
    return getaddrinfo


def test_resolve_checks_every_address_and_names_open_private_ones():
    dns = fake_dns({"up.test": ["93.184.216.34"], "sneaky.test": ["93.184.216.34", "127.0.0.1"],
                    "local.test": ["127.0.0.1"]})
    assert na.resolve("up.test", 80, [], dns) == [(socket.AF_INET, "93.184.216.34")]
    with pytest.raises(na.Refused, match=r"sneaky.test resolves to 127.0.0.1 \(loopback\)"):
        na.resolve("sneaky.test", 80, [], dns)
    with pytest.raises(na.Refused, match="not in this session's allowlist"):
        na.resolve("up.test", 80, ["other.test"], dns)
    with pytest.raises(na.Refused):                  # a wildcard never opens a private address
        na.resolve("local.test", 80, ["*.test"], dns)
    assert na.resolve("local.test", 80, ["local.test"], dns) == [(socket.AF_INET, "127.0.0.1")]
    with pytest.raises(na.Refused, match=r"^127.0.0.1 \(loopback\)"):
        na.resolve("127.0.0.1", 80, [], dns)
    assert na.resolve("[::1]", 80, ["::1"], dns) == [(socket.AF_INET6, "::1")]
    with pytest.raises(OSError):
        na.resolve("nowhere.test", 80, [], dns)
