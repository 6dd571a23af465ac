"""Red team, issue 17: recorded egress (`--net proxy`), held writes, one netns per session.

Who chooses each byte and where does it go? The attackers are a hostile program INSIDE a
`--jail --net proxy` session (kernel backend), and a hostile upstream server. Layers attacked:

  1. overlord/sandbox/netallow.py: the allowlist and the one address guard, as units (every
     spelling of "this machine", wildcards against lookalikes, a name that resolves to
     loopback, what the resolver is actually asked).
  2. overlord/sandbox/netproxy.py: the proxy served on the host from a listener on 127.0.0.1
     with an injected resolver (smuggling, CL+TE, absolute-form vs Host, CONNECT to loopback,
     header injection, resource abuse, forged records).
  3. the engine: a `--jail --net proxy` session on the kernel backend (the empty namespace,
     the holder and its back, the session directory, the life cycle).

Holes are `xfail(strict=True)` with the reason naming what is open and where: the test fails
while the hole is open, and closing it turns the test red until the marker goes. The rest are
attacks that held, kept so they stay held. Runs as root and as the ordinary user.
"""
import ipaddress
import json
import os
import socket
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from overlord.sandbox import netallow as na     # noqa: E402

PUBLIC = "93.184.216.34"          # a public address; nothing here ever connects to it


def fake_resolver(table, asked=None):
    """A getaddrinfo stand-in: name -> [addresses] (family from the address); records what it
    was asked in `asked`; an unknown name is a gaierror, like the real one."""
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if asked is not None:
            asked.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for addr in table[host]:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sa = (addr, port, 0, 0) if fam == socket.AF_INET6 else (addr, port)
            out.append((fam, socket.SOCK_STREAM, 6, "", sa))
        return out
    return getaddrinfo


# == 1. netallow ================================================================================

LOOPBACK_SPELLINGS = [
    "127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f.1", "0x7f000001", "017700000001",
    "0177.0.0.1", "127.255.255.254", "0", "0.0.0.0", "[::1]", "::1", "[::]",
    "[::ffff:127.0.0.1]", "::ffff:7f00:1", "[::127.0.0.1]", "[2002:7f00:1::1]",
    "[64:ff9b::7f00:1]", "localhost", "LOCALHOST", "LocalHost", "localhost.localdomain",
    "ip6-localhost", "ｌｏｃａｌｈｏｓｔ",
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
@pytest.mark.parametrize("allow", [[], ["*.localhost", "*.test", "*.1"]])
def test_every_spelling_of_this_machine_is_refused(host, allow):
    """The real resolver (numeric forms, /etc/hosts, IDNA full-width): no spelling of the
    host's own loopback comes back as a connectable address unless named exactly."""
    try:
        got = na.resolve(host, 80, allow)
    except (na.Refused, OSError):
        return
    pytest.fail(f"{host!r} under {allow} resolved to connectable {got}")


@pytest.mark.parametrize("addr", [
    "127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "::ffff:0:127.0.0.1", "::127.0.0.1", "2002:7f00:1::1", "2002:a00:1::", "64:ff9b::a00:1",
    "64:ff9b:1::7f00:1", "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "fe80::1%lo",
    "fe80::1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "100.64.0.1",
    "198.18.0.1", "192.0.0.170", "224.0.0.251", "255.255.255.255", "240.0.0.1", "fc00::1",
    "fec0::1", "ff02::1", "0.1.2.3", "::2",
])
def test_blocked_knows_every_non_public_address(addr):
    assert na.blocked(addr), addr


def test_blocked_lets_public_addresses_through():
    for addr in (PUBLIC, "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "1.1.1.1"):
        assert na.blocked(addr) is None, addr


@pytest.mark.parametrize("host", ["pypi.org", "evil-pypi.org", "pypi.org.evil.test",
                                  "xpypi.org", "files.pypi.org.evil.test", "pypi.org:443",
                                  "files.pypi.org..", "files.pypi.org%2e", "files。pypi.org",
                                  "files.pypi.org\u3002", "files.pypi.org "])
def test_wildcard_matches_names_below_the_suffix_only(host):
    assert not na.permits(host, ["*.pypi.org"]), host


def test_wildcard_matches_below_in_any_case_and_trailing_dot():
    for host in ("files.pypi.org", "FILES.PYPI.ORG", "files.pypi.org.", "a.b.pypi.org"):
        assert na.permits(host, ["*.pypi.org"]), host


def test_a_name_that_resolves_to_loopback_is_refused_even_under_a_wildcard():
    """DNS is the attacker's: `evil.pypi.org` (matched by the wildcard) answering 127.0.0.1,
    or a mix of a public and a loopback answer (rebinding in one lookup)."""
    table = {"evil.pypi.org": ["127.0.0.1"], "mixed.pypi.org": [PUBLIC, "127.0.0.1"],
             "v6.pypi.org": [PUBLIC, "::1"], "mapped.pypi.org": ["::ffff:127.0.0.1"],
             "meta.pypi.org": ["169.254.169.254"], "lan.pypi.org": ["192.168.0.10"]}
    for host in table:
        with pytest.raises(na.Refused):
            na.resolve(host, 443, ["*.pypi.org"], getaddrinfo=fake_resolver(table))
    with pytest.raises(na.Refused):       # record-only (no list) refuses them too
        na.resolve("evil.pypi.org", 443, [], getaddrinfo=fake_resolver(table))


def test_named_literal_opens_only_that_spelling():
    """--net-allow 127.0.0.1 opens 127.0.0.1; not its mapped/decimal/hex spellings as other
    entries, and never a wildcard's names that resolve there."""
    allow = na.parse(["127.0.0.1", "*.test"])
    assert na.resolve("127.0.0.1", 80, allow) == [(socket.AF_INET, "127.0.0.1")]
    for host in ("2130706433", "0x7f.1", "[::ffff:127.0.0.1]", "localhost"):
        with pytest.raises((na.Refused, OSError)):
            na.resolve(host, 80, allow)
    with pytest.raises(na.Refused):
        na.resolve("loop.test", 80, allow, getaddrinfo=fake_resolver({"loop.test": ["127.0.0.1"]}))


def test_resolve_answers_only_the_checked_addresses():
    table = {"files.pypi.org": [PUBLIC, PUBLIC, "2606:4700:4700::1111"]}
    got = na.resolve("files.pypi.org", 443, ["*.pypi.org"], getaddrinfo=fake_resolver(table))
    assert got == [(socket.AF_INET, PUBLIC), (socket.AF_INET6, "2606:4700:4700::1111")]


@pytest.mark.parametrize("entry", ["", " ", "*", "*.", "**.a.com", "*.*.com", "a.*.com",
                                   "http://a.com", "a.com/x", "a.com:443", "u@a.com", "a..com",
                                   "-a.com", "a_b.com", "a com", "a.com\n", "a.com\x00",
                                   "a.com\r\nX: y", "\x1b[31ma.com", "[a.com]", None, 5, ["a"]])
def test_bad_allowlist_entries_are_refused(entry):
    with pytest.raises(ValueError):
        na.parse([entry])


@pytest.mark.xfail(strict=True, reason="hole: netallow.resolve hands a host with a NUL to "
                   "getaddrinfo, which stops at the NUL: '93.184.216.34\\0.files.pypi.org' passes "
                   "'*.pypi.org' and connects to 93.184.216.34 (no host syntax check in resolve)")
def test_a_nul_in_the_host_does_not_pass_the_wildcard_to_another_host():
    """Python's socket.getaddrinfo passes the host to C as a NUL-terminated string: whatever
    follows the NUL is what `permits` matched, whatever precedes it is what is looked up. So a
    wildcard allowlist lets a CONNECT (or an absolute-form URL) reach ANY public host. The
    real resolver is used (a numeric host: no DNS traffic, nothing is connected to)."""
    host = PUBLIC + "\x00.files.pypi.org"
    assert na.permits(host, ["*.pypi.org"])
    try:
        got = na.resolve(host, 443, ["*.pypi.org"])
    except (na.Refused, OSError):
        return
    pytest.fail(f"{host!r} under *.pypi.org resolved to {got}: not a pypi.org address")


@pytest.mark.parametrize("host", ["x\r\nX-Evil: 1.pypi.org", "files\x1b[2J.pypi.org",
                                  "a b.pypi.org", "a/b.pypi.org", "a@b.pypi.org",
                                  "a:1.pypi.org", "a\t.pypi.org", " files.pypi.org"])
@pytest.mark.xfail(strict=True, reason="hole: netallow.resolve looks up any string whose tail "
                   "matches a wildcard (CR/LF, ESC, space, '/', '@', ':' inside the host are "
                   "handed to the resolver and into the Refused reason) instead of refusing a "
                   "host that is not a host name")
def test_a_host_that_is_not_a_host_name_is_refused_before_lookup(host):
    asked = []
    try:
        na.resolve(host, 443, ["*.pypi.org"],
                   getaddrinfo=fake_resolver({host: [PUBLIC]}, asked))
    except na.Refused:
        assert asked == []
        return
    pytest.fail(f"{host!r} was looked up ({asked})")


@pytest.mark.xfail(strict=True, reason="hole: netallow.within lets an exact entry below a "
                   "policy's '*.suffix' cap, and named() then opens non-public addresses for it: "
                   "a cap that never reaches loopback/private lets the session reach them")
def test_a_wildcard_cap_does_not_become_a_private_address_grant():
    """policy net_allow: ["*.corp.test"] (any public host below corp.test). A session asks
    for `db.corp.test` exactly: within() says it is inside the cap, and because it is named
    exactly, its private/loopback answer is let through -- which the cap alone refuses."""
    cap = na.parse(["*.corp.test"])
    table = {"db.corp.test": ["127.0.0.1"]}
    with pytest.raises(na.Refused):                          # the cap alone: refused
        na.resolve("db.corp.test", 80, cap, getaddrinfo=fake_resolver(table))
    entries = na.parse(["db.corp.test"])
    assert all(na.within(e, cap) for e in entries)          # policy accepts the session
    with pytest.raises(na.Refused):                          # so it must not reach more
        na.resolve("db.corp.test", 80, entries, getaddrinfo=fake_resolver(table))


def test_idna_host_under_the_wildcard_stays_under_it():
    """Unicode that IDNA maps (full-width dots, Kelvin sign): what is matched and what is
    looked up are the same name, so no lookalike escapes the suffix."""
    asked = []
    table = {"xn--80ak6aa92e.pypi.org": [PUBLIC], "key.pypi.org": [PUBLIC]}

    def idna_resolver(host, port, **kw):
        name = host.encode("idna").decode("ascii")
        asked.append(name)
        return fake_resolver(table)(name, port)

    na.resolve("\u212aey.pypi.org", 443, ["*.pypi.org"], getaddrinfo=idna_resolver)
    assert all(a.endswith(".pypi.org") for a in asked)
    with pytest.raises((na.Refused, OSError)):
        na.resolve("evil.test\uff0epypi.org", 443, ["*.pypi.org"], getaddrinfo=idna_resolver)
