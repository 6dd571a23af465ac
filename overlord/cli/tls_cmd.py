"""`overlord tls selfsign`: a certificate and key for `overlord ui` on a private deployment.

openssl makes them (an EC P-256 key, a self-signed certificate whose subjectAltName names every
--host: DNS names, IP addresses as IP entries; not a CA, for server authentication only). The
key is mode 0600 from the moment it exists (made in a 0700 directory, then renamed into place);
the certificate is what clients trust (its SHA-256 fingerprint is printed to compare).
"""
import os
import sys

from overlord import ops
from overlord.errors import OverlordError, UsageError

MAX_DAYS = 3650


def add_parsers(sub):
    p = sub.add_parser("tls", help="TLS for `overlord ui` beyond loopback (tls selfsign)",
                       description="TLS material for `overlord ui --bind ADDR --tls-cert F "
                       "--tls-key F`.")
    ts = p.add_subparsers(dest="tls_command", metavar="COMMAND", parser_class=type(p))
    ts.required = True
    s = ts.add_parser("selfsign", help="make a self-signed certificate and key with openssl",
                      description="Make a self-signed certificate and its key (EC P-256) with "
                      "openssl, for a private deployment: OVERLORD_HOME/tls/cert.pem and key.pem "
                      "(mode 0600), replacing a pair already there. Every --host is in the "
                      "certificate's subjectAltName. Prints both paths and the certificate's "
                      "SHA-256 fingerprint (what a client that trusts it should see).")
    s.add_argument("--host", action="append", required=True, metavar="NAME", dest="names",
                   help="a name (or IP address) clients use to reach the server (repeatable; "
                   "the first is the certificate's subject)")
    s.add_argument("--out", metavar="DIR", help="where to write cert.pem and key.pem "
                   "(default OVERLORD_HOME/tls)")
    s.add_argument("--days", type=int, default=365, metavar="N",
                   help=f"how long the certificate is valid (default 365, at most {MAX_DAYS})")


def _names(raw):
    """(the names, the subjectAltName value): DNS:name or IP:address for each, in order."""
    from overlord.ops import access
    names, alt = [], []
    for value in raw:
        name = access.check_name(value)
        if name is None:
            raise UsageError(f"--host takes a host name or an IP address, not {value[:80]!r}")
        if name in names:
            continue
        names.append(name)
        alt.append(("IP:" if _is_ip(name) else "DNS:") + name)
    return names, ",".join(alt)


def _is_ip(name):
    import ipaddress
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def fingerprint(pem_path):
    """The SHA-256 fingerprint of a PEM certificate, as AB:CD:... (what browsers show)."""
    import hashlib
    import ssl
    with open(pem_path, encoding="ascii") as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def cmd_selfsign(args):
    import shutil
    import subprocess
    import tempfile
    names, alt = _names(args.names)
    if not 1 <= args.days <= MAX_DAYS:
        raise UsageError(f"--days takes 1 to {MAX_DAYS}, not {args.days}")
    openssl = ops.host_tool("openssl")
    if openssl is None:
        raise OverlordError("openssl is not installed (it makes the certificate): install it, "
                            "e.g. apt-get install openssl")
    out = os.path.abspath(args.out) if args.out else os.path.join(ops.ensure_home(), "tls")
    try:
        os.makedirs(out, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise OverlordError(f"cannot make {out}: {exc.strerror}") from None
    if not os.path.isdir(out):
        raise UsageError(f"--out is not a directory: {out}")
    cert, key = os.path.join(out, "cert.pem"), os.path.join(out, "key.pem")
    try:
        work = tempfile.mkdtemp(prefix=".selfsign-", dir=out)       # mode 0700
    except OSError as exc:
        raise OverlordError(f"cannot write in {out}: {exc.strerror}") from None
    try:
        new_key, new_cert = os.path.join(work, "key.pem"), os.path.join(work, "cert.pem")
        cn = names[0][:64]                  # a CN is at most 64 characters
        cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
               "-nodes", "-keyout", new_key, "-out", new_cert, "-days", str(args.days),
               "-subj", f"/CN={cn}", "-addext", f"subjectAltName={alt}",
               "-addext", "basicConstraints=critical,CA:FALSE",
               "-addext", "keyUsage=critical,digitalSignature",
               "-addext", "extendedKeyUsage=serverAuth"]
        old = os.umask(0o077)
        try:
            proc = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OverlordError(f"openssl did not run: {exc}") from None
        finally:
            os.umask(old)
        if proc.returncode != 0 or not (os.path.exists(new_key) and os.path.exists(new_cert)):
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            why = next((ln.strip() for ln in reversed(lines) if ln.strip().strip("-")), "no message")
            raise OverlordError(f"openssl could not make the certificate: {why[:200]}")
        os.chmod(new_key, 0o600)
        os.chmod(new_cert, 0o644)
        os.rename(new_key, key)
        os.rename(new_cert, cert)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"certificate: {cert}")
    print(f"key:         {key} (mode 0600)")
    print(f"SHA-256 fingerprint: {fingerprint(cert)}")
    print(f"  for {', '.join(names)}, valid {args.days} day{'s' if args.days != 1 else ''}; "
          f"serve it with: overlord ui --bind ADDR --tls-cert {cert} --tls-key {key} "
          + " ".join(f"--host {n}" for n in names), file=sys.stderr)
    return 0


def cmd_tls(args):
    return {"selfsign": cmd_selfsign}[args.tls_command](args)


COMMANDS = {"tls": cmd_tls}
