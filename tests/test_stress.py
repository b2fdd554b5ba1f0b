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


def test_processes_racing_on_shared_names_break_nothing() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "10", "--procs", "3"],  # every operation
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
    assert {"own", "write", "rename", "link", "fallocate", "direct", "truncate"} <= set(counts)
    assert int(counts["own"]) > 100
