"""The systemd units in packaging/: systemd's own reading of every one (`systemd-analyze
verify`, which also checks that ExecStart's binary exists and is executable), where
install.sh puts them, and what each file says about itself.

`verify` runs with --root=R: a temporary root holding the host's own unit tree (for
sysinit.target, default.target and the rest), an executable at usr/local/bin/overlord (the
installed launcher's path) and our units in usr/local/lib/systemd/system/ (where install.sh
places overlord-ui.service; systemd 252's --root has no --user scope, so the user units are
read there as well, and once more in the user scope with ExecStart pointed at R's launcher).
A unit passes when systemd-analyze exits 0 and prints nothing: an unknown key or section is
only a warning (exit 0) to it. It does not notice a timer whose Unit= names no unit (exit 0,
silent, systemd 252), so `problems` checks that itself. The negative controls prove each
check can fail."""
import configparser
import ipaddress
import os
import shlex
import shutil
import subprocess

import pytest

import conftest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGING = os.path.join(REPO, "packaging")
LAUNCHER = "/usr/local/bin/overlord"
SYSTEM_UNITS = ("overlord-ui.service",)
USER_UNITS = ("overlordd.service", "overlord-gc.service", "overlord-gc.timer")
# with User= (no CAP_SYS_ADMIN) each implies NoNewPrivileges=yes (systemd.exec(5))
IMPLY_NNP = ("SystemCallFilter", "SystemCallArchitectures", "MemoryDenyWriteExecute",
             "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality",
             "RestrictAddressFamilies", "PrivateDevices", "ProtectKernelTunables",
             "ProtectKernelModules", "ProtectKernelLogs", "ProtectClock", "ProtectHostname",
             "DynamicUser")


def unit_files():
    return sorted(n for n in os.listdir(PACKAGING) if n.endswith((".service", ".timer")))


def read(name):
    with open(os.path.join(PACKAGING, name), encoding="utf-8") as f:
        return f.read()


def parsed(text):
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str
    parser.read_string(text)
    return parser


def comments(text):
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def unit_tree():
    """The host's own system and user unit directories (merged /usr or not)."""
    out = {}
    for scope in ("system", "user"):
        for base in ("/usr/lib/systemd", "/lib/systemd"):
            path = os.path.realpath(os.path.join(base, scope))
            if os.path.isdir(path):
                out[scope] = path
                break
        else:
            pytest.fail(f"no systemd {scope} unit directory on a host with systemd-analyze")
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    conftest.require_tool("systemd-analyze")
    r = tmp_path_factory.mktemp("units-root")
    for scope, path in unit_tree().items():
        shutil.copytree(path, r / "usr/lib/systemd" / scope, symlinks=True)
    executable(r, LAUNCHER)
    return r


def executable(r, path):
    target = r / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("#!/bin/sh\nexit 0\n")
    target.chmod(0o755)


def analyze(*args, env=None):
    proc = subprocess.run(["systemd-analyze", "verify", *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **(env or {})))
    return proc


def problems(r, units, tmp):
    """Everything wrong with `units` ({file name: text}): systemd-analyze's complaints (both
    scopes) and a timer whose unit is not among them. [] when all is well."""
    out = []
    here = r / "usr/local/lib/systemd/system"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    for name, text in units.items():
        (here / name).write_text(text)
    proc = analyze(f"--root={r}", *sorted(units))
    if proc.returncode or proc.stderr.strip() or proc.stdout.strip():
        out.append(f"system scope (exit {proc.returncode}): {proc.stderr.strip()} {proc.stdout.strip()}")
    user = {n: t for n, t in units.items() if n in USER_UNITS or n not in SYSTEM_UNITS}
    if user:                   # the user manager's reading, ExecStart at R's launcher
        where = tmp / "user-units"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        runtime = tmp / "xdg-runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        for name, text in user.items():
            (where / name).write_text(text.replace("\nExecStart=/", f"\nExecStart={r}/"))
        proc = analyze("--user", *sorted(str(where / n) for n in user),
                       env={"XDG_RUNTIME_DIR": str(runtime)})
        if proc.returncode or proc.stderr.strip() or proc.stdout.strip():
            out.append(f"user scope (exit {proc.returncode}): {proc.stderr.strip()} {proc.stdout.strip()}")
    for name, text in units.items():
        if name.endswith(".timer"):
            try:
                timer = parsed(text)["Timer"]
            except (configparser.Error, KeyError) as exc:
                out.append(f"{name}: no [Timer] section ({exc})")
                continue
            wants = timer.get("Unit", name[:-len(".timer")] + ".service")
            if wants not in units:
                out.append(f"{name}: Unit={wants} is not one of the units verified with it")
    return out


def all_units():
    return {n: read(n) for n in unit_files()}


# -- systemd's own reading ------------------------------------------------------------------------

def test_packaging_holds_exactly_the_four_units():
    assert unit_files() == sorted(SYSTEM_UNITS + USER_UNITS)


def test_systemd_analyze_verify_accepts_every_unit(root, tmp_path):
    assert problems(root, all_units(), tmp_path) == []


def test_a_unit_verifies_only_with_its_launcher_there(root, tmp_path):
    """ExecStart's binary is checked: the same units in a root without the launcher fail."""
    os.chmod(root / LAUNCHER.lstrip("/"), 0o644)          # there, but not executable
    try:
        found = problems(root, all_units(), tmp_path)
    finally:
        os.chmod(root / LAUNCHER.lstrip("/"), 0o755)
    assert found and all("is not executable" in p for p in found), found


def test_the_units_verify_at_another_prefix(root, tmp_path):
    """install.sh rewrites /usr/local/ to PREFIX/: the only path a unit depends on."""
    moved = {n: t.replace("/usr/local/", "/opt/ovl/") for n, t in all_units().items()}
    assert all(LAUNCHER not in t for t in moved.values())
    found = problems(root, moved, tmp_path)
    assert found and "/opt/ovl/bin/overlord is not executable" in found[0], found
    executable(root, "/opt/ovl/bin/overlord")
    assert problems(root, moved, tmp_path) == []


def _mutate(name, old, new, count=1):
    def apply(units):
        assert units[name].count(old) >= count, (name, old)
        units[name] = units[name].replace(old, new, count)
        return units
    return apply


NEGATIVE = {
    "unknown directive": (_mutate("overlord-ui.service", "\nDelegate=yes\n",
                                  "\nDelegate=yes\nFrobnicate=yes\n"), "Unknown key 'Frobnicate'"),
    "misspelled section": (_mutate("overlordd.service", "\n[Service]\n", "\n[Servce]\n"),
                           "Unknown section 'Servce'"),
    "misspelled value": (_mutate("overlord-ui.service", "\nKillMode=mixed\n", "\nKillMode=mixd\n"),
                         "Failed to parse kill mode"),
    "nonexistent ExecStart": (_mutate("overlord-gc.service", "\nExecStart=/usr/local/bin/overlord ",
                                      "\nExecStart=/usr/local/bin/overlord-gone "),
                              "/usr/local/bin/overlord-gone is not executable"),
    "relative ExecStart": (_mutate("overlord-ui.service", "\nExecStart=/usr/local/bin/overlord ",
                                   "\nExecStart=overlord/bin "), "nor an absolute path"),
    "timer naming a missing unit": (_mutate("overlord-gc.timer", "\nUnit=overlord-gc.service\n",
                                            "\nUnit=overlord-gcc.service\n"),
                                    "Unit=overlord-gcc.service is not one of"),
    "timer without its unit": (lambda units: {n: t for n, t in units.items()
                                              if n != "overlord-gc.service"},
                               "Unit=overlord-gc.service is not one of"),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_a_broken_unit_is_refused(root, tmp_path, case):
    mutate, expect = NEGATIVE[case]
    found = problems(root, mutate(all_units()), tmp_path)
    assert found, f"{case}: accepted"
    assert any(expect in p for p in found), found


# -- what the files say -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYSTEM_UNITS + USER_UNITS)
def test_every_unit_says_where_it_is_installed_and_what_hardening_it_takes(name):
    text = read(name)
    notes = comments(text)
    scope = "system" if name in SYSTEM_UNITS else "user"
    assert f"/usr/local/lib/systemd/{scope}/" in notes, name
    assert "# Hardening" in notes, name
    assert "PREFIX" in notes and "install.sh" in notes, name
    if name.endswith(".service"):
        service = parsed(text)["Service"]
        argv = shlex.split(service["ExecStart"])
        assert argv[0] == LAUNCHER, argv
        assert "pip" in notes and "ExecStart=" in notes, name    # how a pip install repoints it


def test_the_user_units_tell_a_pip_install_how_to_point_elsewhere():
    for name in ("overlordd.service", "overlord-gc.service"):
        notes = comments(read(name))
        assert "systemctl --user edit" in notes and "%h/.local/bin/overlord" in notes, name


def _ui():
    return parsed(read("overlord-ui.service"))


def test_the_ui_unit_serves_tls_beyond_loopback_under_its_own_account():
    unit = _ui()
    service = unit["Service"]
    assert service["User"] == "overlord" and service["Group"] == "overlord"
    assert service["Environment"] == "OVERLORD_HOME=/var/lib/overlord"
    assert service["StateDirectory"] == "overlord" and service["StateDirectoryMode"] == "0700"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    argv = shlex.split(service["ExecStart"])
    assert argv[:2] == [LAUNCHER, "ui"]
    from overlord.cli.main import build_parser
    args = build_parser("ui").parse_args(argv[1:])        # the real CLI accepts every flag
    assert args.log_json
    assert args.tls_cert == "/var/lib/overlord/tls/cert.pem"       # where tls selfsign writes
    assert args.tls_key == "/var/lib/overlord/tls/key.pem"
    bind = ipaddress.ip_address(args.bind)
    assert not bind.is_loopback, args.bind
    if bind.is_unspecified:                   # the server refuses 0.0.0.0 without --host
        assert args.names, argv


def test_the_ui_unit_takes_no_directive_that_would_break_the_engine():
    service = _ui()["Service"]
    breaking = set(IMPLY_NNP) | {"NoNewPrivileges", "ProtectControlGroups", "PrivateUsers",
                                 "PrivateNetwork", "CapabilityBoundingSet"}
    assert breaking.isdisjoint(service), breaking & set(service)
    for key, value in {"Delegate": "yes", "KillMode": "mixed", "OOMPolicy": "continue",
                       "Restart": "on-failure", "UMask": "0077", "LimitCORE": "0",
                       "ProtectSystem": "full", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "KeyringMode": "private", "RemoveIPC": "yes"}.items():
        assert service.get(key) == value, (key, service.get(key))


def test_the_ui_unit_says_which_directives_it_takes_and_why_not_the_others():
    text = read("overlord-ui.service")
    notes = comments(text)
    service = _ui()["Service"]
    hardening = notes[notes.index("# Hardening"):]
    taken, _, refused = hardening.partition("deliberately NOT")
    assert refused, "no list of what it does not take"
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "UMask", "LimitCORE",
                "KeyringMode", "RemoveIPC", "Delegate", "KillMode", "OOMPolicy", "User"):
        assert key in service and f"{key}=" in taken, key
    for key in ("NoNewPrivileges", "ProtectControlGroups", "PrivateUsers") + IMPLY_NNP[:-1]:
        assert f"{key}=" in refused, key
    assert "fusermount3" in refused and "AppArmor" in refused
    assert "ReadWritePaths=" in notes and "ProtectHome=read-only" in notes


def test_the_ui_unit_has_the_setup_steps():
    notes = comments(read("overlord-ui.service"))
    for step in ("useradd --system", "overlord tls selfsign --host",
                 "overlord users add --role admin", "systemctl enable --now overlord-ui",
                 "/healthz"):
        assert step in notes, step
    # the name in the certificate and --host are the same: %H is the host name
    assert 'selfsign --host "$(hostname)"' in notes and "--host %H" in read("overlord-ui.service")


def test_every_exec_start_is_the_launcher_install_sh_places():
    for name in unit_files():
        if name.endswith(".service"):
            assert shlex.split(parsed(read(name))["Service"]["ExecStart"])[0] == LAUNCHER, name
