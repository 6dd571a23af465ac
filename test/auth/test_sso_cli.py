"""`overlord sso set|show|test|off`, the real CLI in a real process (conftest.Ovl).

The client secret comes from stdin only: on argv it is refused -- without being echoed -- and
nothing is written; it never appears in `sso show`, its --json, or the audit chain.
"""
import json
import os
import stat
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import Ovl  # noqa: E402
from oidcmock import start_mock  # noqa: E402

SECRET = "Sup3r-s3cret-value"
ISSUER = "https://login.example.com"


@pytest.fixture
def ovl(home):
    return Ovl(home)


def sso_set(ovl, *extra, secret=SECRET, issuer=ISSUER, check=0):
    args = ["sso", "set", "--issuer", issuer, "--client-id", "overlord"]
    if secret is not None:
        args.append("--client-secret-stdin")
    return ovl(*args, *extra, input=None if secret is None else (secret + "\n").encode(),
               check=check)


def one_line(proc):
    lines = proc.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err
    return lines[0]


def test_set_show_off(ovl, home):
    p = sso_set(ovl, "--domain", "Example.com", "--domain", "corp.example",
                "--admin", "Boss@example.com", "--viewer", "audit@example.com",
                "--role-claim", "groups", "--role-map", "auditors=viewer",
                "--role-map", "ops=operator", "--default-role", "viewer")
    assert "single sign-on set" in p.out and SECRET not in p.out + p.err
    f = home / "sso.json"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    stored = json.loads(f.read_text())
    assert stored["client_secret"] == SECRET and stored["domains"] == ["example.com",
                                                                       "corp.example"]
    assert stored["role_map"] == {"auditors": "viewer", "ops": "operator"}
    shown = ovl("sso", "show", check=0)
    assert "login.example.com" in shown.out and "boss@example.com" in shown.out
    assert "auditors=viewer" in shown.out and SECRET not in shown.out
    data = json.loads(ovl("sso", "show", "--json", check=0).out)
    assert data["enabled"] is True and data["client_secret"] == "********"
    assert data["default_role"] == "viewer" and data["admins"] == ["boss@example.com"]
    # a change without a new secret keeps the stored one
    sso_set(ovl, "--domain", "example.com", secret=None)
    assert json.loads(f.read_text())["client_secret"] == SECRET
    assert ovl("sso", "off", check=0).out.startswith("single sign-on is off")
    assert not f.exists()
    assert "was not on" in ovl("sso", "off", check=0).out
    assert json.loads(ovl("sso", "show", "--json", check=0).out) == {"enabled": False}
    assert "off" in ovl("sso", "show", check=0).out
    log = (home / "audit.jsonl").read_text()
    acts = [json.loads(line) for line in log.splitlines()]
    assert [a["change"] for a in acts
            if a["action"] == "sso.config"] == ["set", "set", "off"]
    assert SECRET not in log


@pytest.mark.parametrize("argv", [["--client-secret", SECRET], [f"--client-secret={SECRET}"],
                                  ["--client-secret-stdin", "--client-secret", SECRET],
                                  ["--client-secre", SECRET]])
def test_a_secret_on_the_command_line_is_refused_unechoed(ovl, home, argv):
    p = ovl("sso", "set", "--issuer", ISSUER, "--client-id", "x", *argv,
            input=b"from-stdin\n", check=2)
    line = one_line(p)
    assert SECRET not in p.out + p.err
    assert "command line" in line or "ambiguous option" in line
    assert not (home / "sso.json").exists()


@pytest.mark.parametrize("extra,issuer,secret,says", [
    ([], "http://login.example.com", SECRET, "https://"),
    ([], "login.example.com", SECRET, "https://"),
    ([], "https://login.example.com/?q=1", SECRET, "query"),
    (["--domain", "not a domain"], ISSUER, SECRET, "domain"),
    (["--admin", "nobody"], ISSUER, SECRET, "e-mail"),
    (["--admin", "a@example.com", "--viewer", "a@example.com"], ISSUER, SECRET, "both"),
    (["--role-map", "auditors=viewer"], ISSUER, SECRET, "--role-claim"),
    (["--role-claim", "groups", "--role-map", "auditors"], ISSUER, SECRET, "GROUP=ROLE"),
    (["--role-claim", "groups", "--role-map", "g=root"], ISSUER, SECRET, "role"),
    (["--default-role", "god"], ISSUER, SECRET, "invalid choice"),
    ([], ISSUER, "", "no client secret"),
    ([], ISSUER, "two\nlines", "one line"),
    ([], ISSUER, None, "secret"),                          # nothing stored to keep
])
def test_bad_input_is_one_line_and_changes_nothing(ovl, home, extra, issuer, secret, says):
    p = sso_set(ovl, *extra, issuer=issuer, secret=secret, check=2)
    assert says in one_line(p)
    assert not (home / "sso.json").exists()
    if secret:
        assert secret not in p.err


def test_show_refuses_a_file_others_may_read(ovl, home):
    sso_set(ovl, "--domain", "example.com")
    os.chmod(home / "sso.json", 0o640)
    p = ovl("sso", "show", check=1)
    assert "chmod 600" in one_line(p) and SECRET not in p.err


def test_test_against_the_real_provider_and_an_absent_one(ovl):
    assert "not configured" in one_line(ovl("sso", "test", check=1))
    with start_mock() as idp:
        sso_set(ovl, "--domain", "example.com", issuer=idp.issuer)
        p = ovl("sso", "test", check=0)
        assert "discovery answered" in p.out and "RS256" in p.out and p.out.endswith("ok\n")
        assert "1 in the key set, 1 usable" in p.out
        data = json.loads(ovl("sso", "test", "--json", check=0).out)
        assert data["issuer"] == idp.issuer and data["supported"] == ["RS256"]
        issuer = idp.issuer
    p = ovl("sso", "test", check=1)           # the provider has gone
    assert "cannot reach" in one_line(p) and issuer.split("//")[1].split(":")[0] in p.err


def test_help_names_the_stdin_secret(ovl):
    p = ovl("sso", "set", "--help", check=0)
    assert "--client-secret-stdin" in p.out and "--client-secret " not in p.out.replace(
        "--client-secret-stdin", "")
