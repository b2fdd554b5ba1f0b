"""A full disk fails the write cleanly (ENOSPC): the file keeps its old bytes, nothing is
lost, and the mount keeps serving (SPEC §9). The workspace lives on a small tmpfs."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, check_clean


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


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
