"""The first `git status` after a remount against a warm one (docs/performance.md,
"git status after a remount").

A git work tree of N files (default 10,000) is made in a fresh workspace; through the
mount, `git add`, `git commit` and `git status` write the index with the stat data the
mount shows. Then the workspace is unmounted and mounted again, and `git status` is timed
twice: the first after the remount (the kernel's caches are cold, and git re-reads every
file whose recorded stat data no longer matches), then a warm one. Then, first after
another remount, the stat of every file (the lookups alone), and a warm `git status` of
the raw tree.

    .venv/bin/python scripts/bench_git_remount.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RWFS = [str(ROOT / ".venv" / "bin" / "rwfs")]
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@example.com",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        # (no auto gc: it would run on in the background and keep the mount busy)
        ["git", "-c", "core.untrackedCache=false", "-c", "gc.auto=0", *args],
        cwd=cwd,
        env={**ENV, "HOME": str(cwd.parent)},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 10_000
    with tempfile.TemporaryDirectory(prefix="rwfs-bench-git-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        old = time.time() - 3600  # no racily clean entry in the index
        for i in range(n):
            f = ws / f"d{i % 100:02d}" / f"f{i}.txt"
            f.parent.mkdir(exist_ok=True)
            f.write_text(f"line {i}\n" * 20)
            os.utime(f, (old, old))
        subprocess.run([*RWFS, "mount", str(ws)], check=True)
        try:
            git(ws, "init", "-q")
            git(ws, "add", "-A")
            git(ws, "commit", "-q", "-m", "tree")
            git(ws, "status")
        finally:
            subprocess.run([*RWFS, "umount", str(ws)], check=True)
        subprocess.run(["sync"], check=True)
        subprocess.run([*RWFS, "mount", str(ws)], check=True)
        try:
            first = git(ws, "status")
            warm = git(ws, "status")
        finally:
            subprocess.run([*RWFS, "umount", str(ws)], check=True)
        subprocess.run([*RWFS, "mount", str(ws)], check=True)
        try:  # what the lookups alone cost: every file's stat, first after a remount
            t = time.perf_counter()
            subprocess.run(
                ["find", ".", "-printf", "%i\\n"], cwd=ws, check=True, stdout=subprocess.DEVNULL
            )
            lookups = time.perf_counter() - t
        finally:
            subprocess.run([*RWFS, "umount", str(ws)], check=True)
        git(ws, "status")  # the raw tree (its index then holds the raw stat data)
        native = git(ws, "status")
    print(f"files: {n}")
    print(f"git status, first after a remount: {first:.3f} s")
    print(f"git status, warm:                  {warm:.3f} s")
    print(f"find -printf %i, first after a remount: {lookups:.3f} s")
    print(f"git status, native (warm):         {native:.3f} s")


if __name__ == "__main__":
    main()
