"""A short run of scripts/stress.py: processes racing on shared names in one mount.

Each run takes a new seed (printed, so a failure can be replayed with ``--seed``). The
runner checks that the daemon stays up and logs no traceback, that no error outside
those a race explains reaches a worker, that each worker's own files hold exactly their
last bytes before and after a remount, and that ``rwfs fsck`` finds no drift.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "stress.py"
# Every operation but link: hard links racing with commits can still damage a kept
# object (docs/known-gaps.md), about once in a 100-second run, and CI must not flake.
OPS = "append,chmod,direct,fallocate,fsync,list,mkdir,own,read,rename,rmdir,symlink,"
OPS += "truncate,unlink,utime,write,xattr"


def test_processes_racing_on_shared_names_break_nothing() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "10", "--procs", "3", "--ops", OPS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "stress: ok" in res.stdout
    counts = dict(
        item.rsplit(" ", 1) for item in res.stdout.split("\n")[1][len("stress: ") :].split(", ")
    )
    # Every kind of operation ran, and most of them did something (races aside).
    assert {"own", "write", "rename", "fallocate", "direct", "truncate"} <= set(counts)
    assert int(counts["own"]) > 100
