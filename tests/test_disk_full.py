"""A full disk fails the write cleanly (ENOSPC): the file keeps its old bytes, nothing is
lost, and the mount keeps serving (SPEC §9). The workspace lives on a small tmpfs."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from conftest import Mount, check_clean


def test_full_disk_refuses_the_write_and_keeps_the_file(small_fs: Path) -> None:
    ws = small_fs / "ws"
    ws.mkdir()
    (ws / "big.txt").write_bytes(b"original\n" * (700 * 1024))  # about 6 MiB
    m = Mount(ws).start()
    try:
        filler = m.path / "filler.log"  # passthrough: written in place
        with pytest.raises(OSError) as err:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
        assert err.value.errno == errno.ENOSPC
        # Editing the big file needs room for its stage: refused, and nothing changed.
        with pytest.raises(OSError) as err:
            with open(m.path / "big.txt", "r+b") as f:
                f.write(b"CHANGED")
        assert err.value.errno == errno.ENOSPC
        assert (m.path / "big.txt").read_bytes() == b"original\n" * (700 * 1024)
        # Room again: the mount still serves and commits.
        filler.unlink()
        (m.path / "big.txt").write_bytes(b"small now\n")
        assert (m.path / "big.txt").read_bytes() == b"small now\n"
    finally:
        m.stop()
    check_clean(m)
    assert (ws / "big.txt").read_bytes() == b"small now\n"


def test_deleting_files_on_a_full_disk_frees_space(small_fs: Path) -> None:
    # Removed journaled files keep their bytes as objects (history, undo), so removing
    # them frees nothing by itself; on a full disk rwfs gives up those kept bytes (a gc
    # event with reason disk_full says so), and the write that found no room goes through.
    import json
    import os

    ws = small_fs / "ws"
    ws.mkdir()
    for k in range(8):
        (ws / f"old{k}.bin").write_bytes(bytes([k]) * (1 << 20))
    (ws / "keep.txt").write_bytes(b"kept\n")
    m = Mount(ws, log=small_fs.parent / "daemon.log").start()  # (not on the full disk)
    try:
        filler = m.path / "filler.log"  # passthrough: written in place
        with pytest.raises(OSError) as err:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (64 << 10))
        assert err.value.errno == errno.ENOSPC
        for k in range(8):
            (m.path / f"old{k}.bin").unlink()
        (m.path / ".rw" / "ctl").write_text("sync\n")
        new = os.urandom(3 << 20)
        with open(m.path / "new.bin", "wb") as f:
            for off in range(0, len(new), 1 << 20):
                f.write(new[off : off + (1 << 20)])
        assert (m.path / "new.bin").read_bytes() == new
        (m.path / ".rw" / "ctl").write_text("sync\n")
        evs = [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]
        gcs = [e for e in evs if e["op"] == "gc"]
        # (The first unlink, which found no room for its own record, used the reserve and
        # was collected at once; the others at the write.)
        assert gcs and all(e.get("reason") == "disk_full" for e in gcs), gcs
        assert sum(e["removed"] for e in gcs) == 8
        assert sum(e["freed_bytes"] for e in gcs) == 8 << 20
        assert [e["op"] for e in evs if e.get("path") == "new.bin"][-1] == "write"
        # The removed files' history is given up; the live file's is untouched.
        assert (m.path / "keep.txt").read_bytes() == b"kept\n"
        filler.unlink()
    finally:
        m.stop()
    check_clean(m)
    assert (ws / "new.bin").read_bytes() == new
    objects = [os.path.join(d, n) for d, _, ns in os.walk(ws / ".rw" / "objects") for n in ns]
    assert all(os.path.getsize(p) < (1 << 20) for p in objects), objects
