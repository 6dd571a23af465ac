"""The engine's own detached processes (the webhook and witness senders) start isolated: a
PYTHONPATH, a sitecustomize or a shadowing stdlib module the caller chose is never imported
(under the installed launcher that would be the caller's code in its AppArmor profile)."""
import os
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, REPO)
from overlord import relaunch  # noqa: E402

SHADOWS = ("json", "socket", "sitecustomize", "usercustomize", "overlord")


def plant(evil, marker):
    for name in SHADOWS:
        body = f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
        if name == "overlord":
            os.makedirs(evil / name, exist_ok=True)
            (evil / name / "__init__.py").write_text(body)
        else:
            (evil / f"{name}.py").write_text(body)
    (evil / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'a').write('pth\\n')\n")


def test_module_argv_is_isolated_and_names_this_package():
    argv = relaunch.module_argv("overlord.trust.notify", "--send")
    assert argv[0] == sys.executable and argv[1:3] == ["-I", "-S"] and argv[-1] == "--send"
    assert repr(os.path.dirname(os.path.dirname(os.path.abspath(relaunch.__file__)))) in argv[4]


def test_a_sender_never_imports_what_the_callers_environment_chose(tmp_path):
    evil, marker = tmp_path / "evil", tmp_path / "marker"
    evil.mkdir()
    plant(evil, marker)
    env = dict(os.environ, PYTHONPATH=str(evil), PYTHONSTARTUP=str(evil / "json.py"),
               PYTHONUSERBASE=str(evil), OVERLORD_HOME=str(tmp_path / "home"))
    for module, flag in (("overlord.trust.notify", "--send"),
                         ("overlord.trust.witness", "--auto-send")):
        proc = subprocess.run(relaunch.module_argv(module, flag), cwd=evil, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), proc.stderr
        assert "Traceback" not in proc.stderr
    assert not marker.exists(), marker.read_text()
    # the control: the same environment does reach a plain `python -m`
    subprocess.run([sys.executable, "-c", "import json"], cwd=evil, env=env, timeout=60)
    assert marker.exists()
