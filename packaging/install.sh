#!/usr/bin/env bash
# OVERLORD's installer: the system part (root, Linux, dependencies, a compiler, an interpreter)
# in bash; the install itself (staging, placing, rollback, manifest) in packaging/install.py.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: install.sh [--prefix DIR] [--no-deps] [--uninstall] [--python PATH] [-h|--help]

Installs OVERLORD as a system component (run as root: sudo bash packaging/install.sh):
  PREFIX/lib/overlord/              the engine (byte-compiled), the SDK overlord_client.py,
                                    main.py and install-manifest.json (what was placed)
  PREFIX/bin/overlord               the launcher, compiled here from packaging/launcher.c
  PREFIX/lib/systemd/system/        overlord-ui.service
  PREFIX/lib/systemd/user/          overlordd.service, overlord-gc.service, overlord-gc.timer
  PREFIX/share/overlord/skills/     the example skills
  /etc/apparmor.d/overlord          only where AppArmor restricts user namespaces
and, with apt (Debian, Ubuntu), the packages it needs: python3 fuse-overlayfs fuse3 strace git
gcc libc6-dev (bpftrace too where available). Then runs `overlord doctor`.
A second run with nothing changed changes nothing.

  --prefix DIR     install under DIR (absolute; default /usr/local)
  --no-deps        install no packages (python3 >= 3.9 and a C compiler are still required)
  --uninstall      remove exactly what the install manifest names (never ~/.overlord)
  --python PATH    the interpreter the launcher runs (default /usr/bin/python3)
  -h, --help       this text
EOF
}

# a command on PATH that is an executable file (bash's `command -v` also names a non-executable one)
have() { local p; p=$(command -v "$1") && [ -f "$p" ] && [ -x "$p" ]; }
die() { echo "install.sh: $*" >&2; exit 1; }
bad_usage() { echo "install.sh: $* (see --help)" >&2; exit 2; }

prefix=/usr/local
deps=1
uninstall=0
python=
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --prefix) [ $# -ge 2 ] || bad_usage "--prefix needs a directory"; prefix=$2; shift ;;
        --prefix=*) prefix=${1#--prefix=} ;;
        --python) [ $# -ge 2 ] || bad_usage "--python needs a path"; python=$2; shift ;;
        --python=*) python=${1#--python=} ;;
        --no-deps) deps=0 ;;
        --uninstall) uninstall=1 ;;
        *) bad_usage "unknown option: $1" ;;
    esac
    shift
done
case "$prefix" in
    /*) ;;
    *) bad_usage "--prefix must be an absolute path: $prefix" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (sudo bash packaging/install.sh)"
[ "$(uname -s)" = Linux ] || die "OVERLORD runs on Linux only (this is $(uname -s)): see the README for WSL2 and Docker"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ "$uninstall" = 0 ] && [ "$deps" = 1 ]; then
    if have apt-get && have dpkg-query; then
        missing=
        for pkg in python3 fuse-overlayfs fuse3 strace git gcc libc6-dev; do
            dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' \
                || missing="$missing $pkg"
        done
        if [ -n "$missing" ]; then
            apt-get update -qq >/dev/null || die "apt-get update failed"
            if ! dpkg-query -W -f='${Status}' bpftrace 2>/dev/null | grep -q 'ok installed' \
                && apt-cache show bpftrace >/dev/null 2>&1; then
                missing="$missing bpftrace"               # optional: where the archive has it
            fi
            echo "deps: apt-get install$missing"
            # shellcheck disable=SC2086  # one word per package
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -o DPkg::Lock::Timeout=300 $missing \
                >/dev/null || die "apt-get install$missing failed"
        else
            echo "deps: python3 fuse-overlayfs fuse3 strace git gcc libc6-dev are installed"
        fi
    else
        missing=
        for pair in python3:python3 fuse-overlayfs:fuse-overlayfs fusermount3:fuse3 \
                    strace:strace git:git "${CC:-cc}:gcc"; do
            cmd=${pair%%:*}
            have "${cmd%% *}" || missing="$missing ${pair##*:}"
        done
        [ -z "$missing" ] || die "missing:$missing (install them with your package manager, then run again)"
        echo "deps: python3 fuse-overlayfs fuse3 strace git and a C compiler are installed"
    fi
    have bpftrace || echo "deps: bpftrace is not installed (optional: only --trace ebpf needs it)"
elif [ "$uninstall" = 0 ]; then
    echo "deps: skipped (--no-deps)"
fi

if [ "$uninstall" = 0 ]; then
    cc=${CC:-cc}
    have "${cc%% *}" || die "no C compiler (${CC:-cc}): apt-get install gcc libc6-dev, or set CC"
fi

if [ -z "$python" ]; then
    if [ -e /usr/bin/python3 ]; then python=/usr/bin/python3
    else python=$(command -v python3) || die "no python3 (apt-get install python3, or --python PATH)"
    fi
fi
PY=$(realpath -e -- "$python" 2>/dev/null) || die "no such interpreter: $python"
[ -f "$PY" ] && [ -x "$PY" ] || die "not an executable file: $PY"
"$PY" -I -S -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null \
    || die "$PY is not Python 3.9 or newer (OVERLORD needs 3.9+; --python PATH)"

args=(--prefix "$prefix" --python "$PY")
[ "$uninstall" = 0 ] || args+=(--uninstall)
exec "$PY" -I -S "$here/install.py" "${args[@]}"
