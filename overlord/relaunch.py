"""Starting another process of this very OVERLORD: this interpreter, isolated (-I: no PYTHON*
variables, no user site, no current directory on sys.path; -S: no site-packages, so no .pth
file runs), importing this package from where it lies now. Never from a PYTHONPATH the
caller's environment chose: under the installed launcher that would run the caller's code
inside the launcher's AppArmor profile (docs/INSTALL.md)."""
import os
import sys

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_argv(module, *args):
    """argv running `python -m module args...` the isolated way."""
    boot = (f"import sys, runpy; sys.path.insert(0, {PACKAGE_PARENT!r}); "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-I", "-S", "-c", boot, *args]
