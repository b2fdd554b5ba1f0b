"""A stage is a reflink where the backing filesystem shares extents (SPEC §3.2 step 1).

The workspace lives on a small XFS filesystem in a loop-mounted image file made for the
test (XFS shares extents by default), so the test needs root, loop devices and mkfs.xfs
(xfsprogs, which scripts/test installs).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from conftest import Mount, check_clean

MIB = 1 << 20


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_stage_on_xfs_shares_the_files_extents(xfs: Path) -> None:
    ws = xfs / "ws"
    ws.mkdir()
    old = os.urandom(64 * MIB)
    (ws / "big.bin").write_bytes(old)
    m = Mount(ws).start()
    try:
        before = used(xfs)
        with open(m.path / "big.bin", "r+b") as f:
            f.write(b"head")  # the first write makes the inode's stage
            f.flush()
            os.fsync(f.fileno())  # a commit point: the stage is renamed over the file
            staged = used(xfs) - before
        new = b"head" + old[4:]
        assert (m.path / "big.bin").read_bytes() == new
        # A copy would have taken 64 MiB more; the reflink shares all but the written block
        # (and the old bytes are kept as an object by hard link, not copied either).
        assert staged < 8 * MIB, f"the stage took {staged / MIB:.1f} MiB"
        writes = [
            line
            for line in (m.path / ".rw" / "journal").read_text().splitlines()
            if '"op": "write"' in line and "big.bin" in line
        ]
        digest = "sha256:" + hashlib.sha256(new).hexdigest()
        assert len(writes) == 1 and digest in writes[0]
        assert ("sha256:" + hashlib.sha256(old).hexdigest()) in writes[0]
    finally:
        m.stop()
    check_clean(m)
