"""A short run of scripts/stress.py: processes racing on shared names in one mount.

Each run takes a new seed (printed, so a failure can be replayed with ``--seed``). The
runner checks that the daemon stays up and logs no traceback, that no error outside
those a race explains reaches a worker, that each worker's own files hold exactly their
last bytes before and after a remount (some under node_modules/, passed through the
kernel: the fast path), and that ``rwfs fsck`` finds no drift.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "stress.py"


@pytest.mark.parametrize("durability", ["group", "strict"])
def test_processes_racing_on_shared_names_break_nothing(durability: str) -> None:
    # Every operation; strict makes writers wait for their commits, group lets them queue.
    cmd = [sys.executable, str(SCRIPT), "--seconds", "10", "--procs", "3"]
    res = subprocess.run(
        [*cmd, "--durability", durability],
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
    # Some own files are under node_modules/: their opens went through the kernel.
    fast = [ln for ln in res.stdout.splitlines() if ln.startswith("stress: opens passed")]
    assert fast and int(fast[0].rsplit(" ", 1)[1]) > 0, res.stdout
