"""The journal's model of the tree stays true: replayed in LSN order, the journal gives each
path the bytes the tree holds (``rwfs fsck`` agrees), whatever order the tree saw the changes
in. Regressions named after what they guard: a hard-linked file's other names journaled at
its write's LSN, and no drift from the files rwfs does not journal (passthrough names,
files past ``max_journaled_bytes``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from conftest import Mount, check_clean


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


def test_a_links_names_are_journaled_as_they_were_at_its_write(workspace: Path) -> None:
    """A write through one name of a hard-linked file, then a rename of the directory of
    another name the mount has not looked up since the remount: the write is journaled
    with the name the link had then (D1/y), before the rename moves it; replayed, the
    journal gives D3/y the new bytes, as the tree has them."""
    m = Mount(workspace).start()
    try:
        (m.path / "D1").mkdir()
        (m.path / "D1" / "y").write_text("a\n")
        os.link(m.path / "D1" / "y", m.path / "x")
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        with open(m.path / "x", "a") as f:
            f.write("b\n")
        os.rename(m.path / "D1", m.path / "D3")
        assert (m.path / "D3" / "y").read_text() == "a\nb\n"
        events = journal(m)
        write = next(e for e in events if e["op"] == "write" and e["path"] == "x")
        rename = next(e for e in events if e["op"] == "rename" and e["path"] == "D1")
        assert write["lsn"] < rename["lsn"]
        assert write["links"] == ["D1/y"]
        hist = m.path / ".rw" / "history" / "D3" / "y"
        got = [(hist / v).read_text() for v in sorted(os.listdir(hist))]
        assert got[-1] == "a\nb\n" and "a\n" in got, got
    finally:
        m.stop()
    check_clean(m)
