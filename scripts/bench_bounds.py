"""rwfs bounds bench (SPEC §3.3b "Bounded"): what a snapshot operation costs as snapshots
pile up, and the daemon's memory per file it knows. Timings belong here, never in tests.

Rows (``--only`` takes their names):

- ``snapshots``: ``mkdir .rw/snapshots/sN`` until there are ``--snapshots`` (10,000), then
  the time of the next ``mkdir`` against that of the 10th, and of ``rwfs snapshot`` (the
  listing, which reads every snapshot's ``info``) at a tenth of them and at all of them.
- ``rss``: the daemon's VmRSS (``/proc/PID/status``) before and after ``--files``
  (100,000) files are created through the mount (written, closed), per file.
- ``sparse``: ``pwrite`` of 4 KiB at 4 GiB and 16 TiB − 8 KiB of a journaled file, then
  ``fsync`` (the commit costs the data, not the size).

Each row mounts a fresh workspace under a temporary directory over itself and always
unmounts it (bench.Mount). Run: ``.venv/bin/python scripts/bench_bounds.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Mount, log  # noqa: E402


@contextmanager
def mounted(tag: str) -> Iterator[Mount]:
    with tempfile.TemporaryDirectory(prefix=f"rwfs-bounds-{tag}-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        m = Mount(ws, "group", Path(tmp) / "daemon.log")
        m.start()
        try:
            yield m
        finally:
            m.stop()


def _timed_mkdir(top: Path, name: str) -> float:
    t = time.perf_counter()
    os.mkdir(top / name)
    return time.perf_counter() - t


def snapshots(n: int) -> None:
    with mounted("snapshots") as m:
        top = m.workspace / ".rw" / "snapshots"
        (m.workspace / "a.txt").write_text("a\n")
        early: list[float] = []
        late: list[float] = []
        listing: dict[int, float] = {}
        t0 = time.perf_counter()
        for k in range(1, n + 1):
            dt = _timed_mkdir(top, f"s{k}")
            if 10 <= k < 20:
                early.append(dt)
            if k in (n // 10, n):
                t = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "rwfs.cli", "snapshot", "-C", str(m.workspace)],
                    check=True,
                    capture_output=True,
                )
                listing[k] = time.perf_counter() - t
            if k % 1000 == 0:
                log(f"{k} snapshots, {time.perf_counter() - t0:.1f} s")
        for k in range(n + 1, n + 11):
            late.append(_timed_mkdir(top, f"s{k}"))
        print(f"snapshots: mkdir of the 10th-19th: median {statistics.median(early) * 1e3:.2f} ms")
        print(
            f"snapshots: mkdir of the {n + 1}th-{n + 10}th: median "
            f"{statistics.median(late) * 1e3:.2f} ms (the {n + 1}th: {late[0] * 1e3:.2f} ms)"
        )
        for k, dt in sorted(listing.items()):
            print(f"snapshots: rwfs snapshot (listing) at {k}: {dt:.2f} s")


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def rss(n: int) -> None:
    with mounted("rss") as m:
        (m.workspace / "warm").write_text("warm\n")
        before = _rss_kib(m.pid)
        t = time.perf_counter()
        for k in range(n):
            d = m.workspace / f"d{k // 1000}"
            if k % 1000 == 0:
                d.mkdir()
            (d / f"f{k}.txt").write_text(f"file {k}\n")
        took = time.perf_counter() - t
        (m.workspace / ".rw" / "ctl").write_text("sync\n")
        after = _rss_kib(m.pid)
        print(
            f"rss: {n} files created in {took:.1f} s; daemon VmRSS {before / 1024:.1f} MiB "
            f"-> {after / 1024:.1f} MiB: {(after - before) * 1024 / n:.0f} bytes per file"
        )


def sparse() -> None:
    with mounted("sparse") as m:
        for off in (4 << 30, (16 << 40) - 8192):
            f = m.workspace / f"sparse-{off}.txt"
            f.write_text("journaled\n")
            fd = os.open(f, os.O_RDWR)
            try:
                t = time.perf_counter()
                os.pwrite(fd, b"x" * 4096, off)
                t1 = time.perf_counter()
                os.fsync(fd)
                t2 = time.perf_counter()
            finally:
                os.close(fd)
            print(
                f"sparse: 4 KiB at {off}: write {(t1 - t) * 1e3:.1f} ms, fsync {(t2 - t1) * 1e3:.1f} ms"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="snapshots,rss,sparse")
    ap.add_argument("--snapshots", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=100_000)
    a = ap.parse_args()
    rows = a.only.split(",")
    if "sparse" in rows:
        sparse()
    if "snapshots" in rows:
        snapshots(a.snapshots)
    if "rss" in rows:
        rss(a.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
