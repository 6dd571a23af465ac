"""Who a proxied session may talk to: allowlist entries, matching, and the address guard.

One place for the rule every outbound path of OVERLORD follows (the egress proxy, a held
request's release, a webhook delivery): a name is resolved once, every address it resolves
to is checked, and the connection goes to a checked address, never to a second lookup.

Entries (`--net-allow`, the manifest's `"net_allow"`, a policy's cap):
  - a host name, `pypi.org`: that name only;
  - `*.suffix`, `*.pypi.org`: any name below the suffix (`files.pypi.org`), not the suffix itself;
  - a literal address, `127.0.0.1` or `::1` (brackets allowed): that address only.
Loopback, link-local, private, CGNAT, ULA and other non-public addresses are refused unless the
host was named exactly (a wildcard never opens them): nothing reaches the host's own services,
OVERLORD's UI included, by accident.
"""
import ipaddress
import re

MAX_ENTRIES = 256
_LABEL = re.compile(r"\A(?!-)[a-z0-9-]{1,63}(?<!-)\Z")


class Refused(Exception):
    """A destination the rule refuses; str() is the one-line reason."""


def _is_name(text):
    if not text or len(text) > 253:
        return False
    return all(_LABEL.match(label) for label in text.split("."))


def literal(host):
    """The host as an ip_address if it is a literal one ("[::1]" too), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def normal(host):
    """A host as matched: lower case, no trailing dot, an address in its canonical form."""
    ip = literal(host)
    if ip is not None:
        return str(ip)
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


def checked(host):
    """A destination host as it will be matched and looked up: a literal address in its
    canonical form, or an ASCII host name (IDNA applied, lower case, no trailing dot) made of
    valid labels only. Raises Refused for anything else: a NUL, white space, '@', '/', ':' or a
    control byte never reaches the matcher or the resolver (the C resolver stops at a NUL, so
    what was matched and what is looked up could differ)."""
    if not isinstance(host, str) or not host or len(host) > 255:
        raise Refused("not a host name")
    ip = literal(host)
    if ip is not None:
        return str(ip)
    try:
        name = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise Refused(f"{host.encode('unicode_escape').decode('ascii')[:80]} is not a host name") from None
    name = normal(name)
    if not _is_name(name):
        raise Refused(f"{name.encode('unicode_escape').decode('ascii')[:80]} is not a host name")
    return name


def parse_entry(entry):
    """One allowlist entry, normalised; raises ValueError naming what is wrong with it."""
    if not isinstance(entry, str):
        raise ValueError(f"an allowlist entry must be a string, not {type(entry).__name__}")
    text = entry.strip()
    if not text:
        raise ValueError("an empty allowlist entry")
    shown = repr(entry) if len(entry) <= 80 else repr(entry[:77] + "...")
    if text != entry or any(c.isspace() for c in text):
        raise ValueError(f"allowlist entry {shown} contains white space")
    if literal(text) is not None:
        return normal(text)
    host = normal(text)
    if host.startswith("*."):
        if _is_name(host[2:]):
            return host
        raise ValueError(f"allowlist entry {shown}: after '*.' must come a host name")
    if "*" in host:
        raise ValueError(f"allowlist entry {shown}: a wildcard is only allowed as a leading '*.'")
    if "://" in host or "/" in host or ":" in host or "@" in host:
        raise ValueError(f"allowlist entry {shown} is not a host name (no scheme, port or path)")
    if not _is_name(host):
        raise ValueError(f"allowlist entry {shown} is not a host name")
    return host


def parse(entries, where="net_allow"):
    """A whole list, normalised and de-duplicated in order; raises ValueError."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"{where} must be a list of host names")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"{where} has {len(entries)} entries (at most {MAX_ENTRIES})")
    out = []
    for entry in entries:
        value = parse_entry(entry)
        if value not in out:
            out.append(value)
    return out


def permits(host, allow):
    """Whether the allowlist lets host through (no list: everything is recorded, not refused)."""
    try:
        host = checked(host)
    except Refused:
        return False
    if not allow:
        return True
    for entry in allow:
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


def named(host, allow):
    """Whether host is named exactly (not by a wildcard): what opens a non-public address."""
    try:
        return checked(host) in (allow or ())
    except Refused:
        return False


def within(entry, cap):
    """Whether an allowlist entry asks for no more than the cap's entries allow."""
    if entry in cap:
        return True
    if entry.startswith("*."):
        return any(c.startswith("*.") and entry.endswith(c[1:]) for c in cap)
    return literal(entry) is None and permits(entry, cap)


def blocked(address):
    """Why an address is not public (so refused unless named), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an address"
    if ip.version == 6:
        embedded = None
        if ip.ipv4_mapped is not None:
            embedded = ip.ipv4_mapped
        elif ip.sixtofour is not None:
            embedded = ip.sixtofour
        elif ip in ipaddress.ip_network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip in ipaddress.ip_network("::/96") and int(ip) > 1:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)    # IPv4-compatible
        if embedded is not None:
            why = blocked(str(embedded))
            return f"{why} (embedded in {ip})" if why else None
    checks = (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
              ("link-local", ip.is_link_local), ("multicast", ip.is_multicast))
    for why, hit in checks:
        if hit:
            return why
    nets = (("this-network", "0.0.0.0/8"), ("private", "10.0.0.0/8"),
            ("private", "172.16.0.0/12"), ("private", "192.168.0.0/16"),
            ("CGNAT", "100.64.0.0/10"), ("ULA", "fc00::/7"), ("site-local", "fec0::/10"))
    for why, net in nets:
        n = ipaddress.ip_network(net)
        if n.version == ip.version and ip in n:
            return why
    if ip.is_reserved or ip.is_private or not ip.is_global:
        return "not a public address"
    return None


def resolve(host, port, allow, getaddrinfo=None, cap=None):
    """[(family, address)] to connect to for host:port under allow, every address checked.
    Raises Refused (not a host name, outside the list, a non-public address not named) or
    OSError (no such name). The caller connects to these addresses; it never looks the name
    up again. cap: a policy's allowlist the session's was checked against; a non-public
    address then needs the host named exactly in the cap too (a wildcard cap never grants one,
    whatever the session's own list names)."""
    import socket
    host = checked(host)
    if not permits(host, allow) or (cap is not None and not permits(host, cap)):
        raise Refused(f"{host} is not in this session's allowlist")
    ip = literal(host)
    if ip is not None:
        infos = [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, str(ip))]
    else:
        found = (getaddrinfo or socket.getaddrinfo)(host, port, type=socket.SOCK_STREAM)
        infos = [(f, sa[0]) for f, _t, _p, _c, sa in found if f in (socket.AF_INET, socket.AF_INET6)]
    out = []
    opens = named(host, allow) and (cap is None or named(host, cap))
    for family, addr in infos:
        why = blocked(addr)
        if why and not opens:
            shown = host
            said = shown if shown == addr else f"{shown} resolves to {addr}"
            raise Refused(f"{said} ({why}); only a host named exactly in --net-allow may "
                          "reach a non-public address")
        if (family, addr) not in out:
            out.append((family, addr))
    if not out:
        raise OSError(f"cannot resolve {host}: no address")
    return out
