# Sourced by scripts/rwfs and scripts/test: brings a fresh Debian machine to the point where
# the project runs. Installs system packages only when missing, creates .venv, and reinstalls
# the project whenever pyproject.toml changed since the last install.
set -euo pipefail
RWFS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

rwfs_apt_install() {
    # $@: Debian packages to install when any is missing.
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
        echo "rwfs: missing system packages: ${missing[*]} (install them as root)" >&2
        return 1
    fi
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "rwfs: installing system packages: ${missing[*]}" >&2
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
}

rwfs_venv() {
    # $1: pip extras ("" or "[test]")
    local venv="$RWFS_ROOT/.venv" stamp
    # The C extension is built by the install: a change to it needs one too.
    stamp="$(cat "$RWFS_ROOT/pyproject.toml" "$RWFS_ROOT/setup.py" "$RWFS_ROOT/src/rwfs/fuse/_fuseopen.c" \
        | sha256sum | cut -c1-16)$1"
    if [ ! -x "$venv/bin/python" ]; then
        # RWFS_PYTHON: the Python to build it on (one every user can run, for a shared install).
        "${RWFS_PYTHON:-python3}" -m venv "$venv"
    fi
    local have
    have="$(cat "$venv/.rwfs-stamp" 2>/dev/null || true)"
    # An install with the test extras also serves a plain run.
    if [ "$have" != "$stamp" ] && [ "$have" != "${stamp}[test]" ]; then
        "$venv/bin/python" -m pip install -q --upgrade pip >&2
        "$venv/bin/python" -m pip install -q -e "$RWFS_ROOT$1" >&2
        echo "$stamp" > "$venv/.rwfs-stamp"
    fi
    # Bytecode, so that a verb does not compile the package at each start (about 40 ms of
    # one): written even where the environment says not to (PYTHONDONTWRITEBYTECODE), and
    # again after an edit. The mark is set first, so an edit made while this runs is seen
    # next time; a stale .pyc is never used (Python checks the source's mtime).
    local compiled="$venv/.rwfs-compiled"
    if [ ! -e "$compiled" ] || [ -n "$(find "$RWFS_ROOT/src/rwfs" -name '*.py' -newer "$compiled" -print -quit)" ]; then
        touch "$compiled"
        "$venv/bin/python" -m compileall -q "$RWFS_ROOT/src/rwfs" >/dev/null || rm -f "$compiled"
    fi
}
