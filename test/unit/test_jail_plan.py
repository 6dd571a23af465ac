"""The jail's plan, as data: validated before any mount."""
import pytest

from overlord.errors import OverlordError
from overlord.sandbox import jail


def kinds(ops):
    return {(op.kind, op.dest) for op in ops}


def test_plan_binds_the_target_and_system_dirs_and_nothing_of_home(tmp_path):
    ops = jail.plan(str(tmp_path))
    got = kinds(ops)
    assert ("bind", str(tmp_path)) in got and ("tmpfs", "/tmp") in got and ("proc", "/proc") in got
    assert any(d == "/usr" for _, d in got)
    assert not any(d.startswith(("/home", "/root", "/run", "/mnt", "/srv", "/media")) for _, d in got)


@pytest.mark.parametrize("target", ["/usr/share", "/etc", "/proc/self", "/dev/shm/x"])
def test_a_target_inside_a_system_directory_cannot_be_jailed(target):
    with pytest.raises(OverlordError):
        jail.plan(target)


def test_resolver_behind_a_symlink_out_of_etc_is_bound_only_with_the_network(monkeypatch, tmp_path):
    real = tmp_path / "run" / "resolv.conf"
    real.parent.mkdir()
    real.write_text("nameserver 127.0.0.53\n")
    monkeypatch.setattr(jail.os.path, "islink", lambda p: p == "/etc/resolv.conf" or False)
    monkeypatch.setattr(jail.os.path, "realpath", lambda p: str(real) if p == "/etc/resolv.conf" else p)
    host = kinds(jail.plan("/srv/proj", net="host"))
    offline = kinds(jail.plan("/srv/proj", net="none"))
    assert ("ro-bind-file", str(real)) in host
    assert not any(k == "ro-bind-file" for k, _ in offline)
