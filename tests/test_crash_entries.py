"""Recovery always mounts, whatever kind of entry the intent log names (SPEC §3.3a, §6.2).

The daemon really dies (SIGKILL: a kill from outside, or the ``after_namespace_op`` fault
point inside an operation) with intent records naming every kind of entry: a regular
file, a directory, a symlink, a hard-linked file, a FIFO, character and block device
nodes and a socket. The workspace is really mounted again: it must mount, settle every
record (nothing held, nothing failed), never open anything but a regular file (a FIFO
would block it, a socket or a device with no driver fails with ENXIO), and ``rwfs fsck``
must agree with the tree.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.journal.store import Store
from rwfs.policy import DEFAULT_TEXT

# Every kind of entry, and how to make one at a path (in the raw tree or through the
# mount). A device node with no driver (c 0 0) fails an open with ENXIO, as a socket
# does; /dev/null's (c 1 3) would open: recovery must not open either.
KINDS: dict[str, Callable[[Path], None]] = {
    # Empty: written bytes would be a commit, which a rename of the file settles first
    # (the group committer runs), and the intent log would be applied before the kill.
    "regular": lambda p: p.touch(),
    "dir": lambda p: p.mkdir(),
    "symlink": lambda p: os.symlink("regular-target", p),
    "hardlink": lambda p: os.link(p.parent / "base.txt", p),
    "fifo": lambda p: os.mkfifo(p),
    "chardev": lambda p: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(1, 3)),
    "chardev_nodriver": lambda p: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(0, 0)),
    "blockdev": lambda p: os.mknod(p, stat.S_IFBLK | 0o644, os.makedev(7, 250)),
    # A socket as bind() makes it (bind needs a path under 108 bytes; tmp paths are long).
    "socket": lambda p: os.mknod(p, stat.S_IFSOCK | 0o644),
}
TYPE = {
    "regular": stat.S_ISREG,
    "dir": stat.S_ISDIR,
    "symlink": stat.S_ISLNK,
    "hardlink": stat.S_ISREG,
    "fifo": stat.S_ISFIFO,
    "chardev": stat.S_ISCHR,
    "chardev_nodriver": stat.S_ISCHR,
    "blockdev": stat.S_ISBLK,
    "socket": stat.S_ISSOCK,
}
SLOW_COMMITS = DEFAULT_TEXT.replace("commit_interval_ms = 500", "commit_interval_ms = 60000")


def _events(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def _status(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "status").read_text())


def _recovered_cleanly(m: Mount) -> None:
    """The remount settled everything: nothing left unsettled, nothing failed or held."""
    status = _status(m)
    assert status["unsettled"] == [], status["unsettled"]
    log = m.log_text()
    assert "could not settle" not in log, log
    # The summary names only the counts that are not zero ("rwfs: recovered: 3 intents").
    assert not re.search(r"rwfs: recovered: .*\d+ failed", log), log


def test_unapplied_intents_naming_every_kind_of_entry_recover(workspace: Path) -> None:
    """Made, renamed, renamed over and removed through the mount, then SIGKILL before the
    group committer ran (a 60 s interval): only the intent log knows any of it."""
    prepare_state(workspace, SLOW_COMMITS)
    (workspace / "base.txt").write_bytes(b"linked\n")
    for kind in KINDS:
        (workspace / f"victim-{kind}.txt").write_bytes(f"replaced by {kind}\n".encode())
    (workspace / "edited.txt").write_bytes(b"old\n" * 40)
    for kind in ("fifo", "chardev_nodriver", "socket"):
        (workspace / f"over-{kind}.txt").write_bytes(f"over {kind}\n".encode())
    m = Mount(workspace).start()
    M = m.path
    for kind, make in KINDS.items():
        make(M / f"{kind}-1")  # create, mkdir, symlink, link
        os.rename(M / f"{kind}-1", M / f"{kind}-2")
        if kind != "dir":  # a rename over a journaled file: its bytes are kept
            make(M / f"{kind}-3")
            os.rename(M / f"{kind}-3", M / f"victim-{kind}.txt")
        make(M / f"{kind}-4")
        if kind == "dir":
            os.rmdir(M / f"{kind}-4")
        else:
            os.unlink(M / f"{kind}-4")
    # A regular file renamed over a FIFO, a device node and a socket.
    for kind in ("fifo", "chardev_nodriver", "socket"):
        KINDS[kind](M / f"under-{kind}")
        os.rename(M / f"over-{kind}.txt", M / f"under-{kind}")
    (M / "edited.txt").write_bytes(b"new\n" * 40)  # a commit's intent record, unapplied
    m.kill()
    # Nothing journaled yet: every record is only in the intent log. (Read from the raw
    # state: reading .rw/status through the mount would journal what is queued.)
    store = Store(str(workspace / ".rw" / "journal"))
    try:
        assert store.meta_int(b"lsn") == 0, "the group committer ran: nothing left to recover"
    finally:
        store.close()
    logs = workspace / ".rw" / "intents"
    assert sum(p.stat().st_size for p in logs.iterdir()) > 0

    m = Mount(workspace).start()
    try:
        _recovered_cleanly(m)
        raw = workspace  # mounted over itself: through the mount
        for kind in KINDS:
            st = os.lstat(raw / f"{kind}-2")
            assert TYPE[kind](st.st_mode), f"{kind}-2 is not a {kind}"
            assert not os.path.lexists(raw / f"{kind}-1")
            assert not os.path.lexists(raw / f"{kind}-4")
            if kind != "dir":
                assert TYPE[kind](os.lstat(raw / f"victim-{kind}.txt").st_mode)
        assert (M / "edited.txt").read_bytes() == b"new\n" * 40
        for kind in ("fifo", "chardev_nodriver", "socket"):
            assert (M / f"under-{kind}").read_bytes() == f"over {kind}\n".encode()
        evs = _events(m)
        renames = {(e["path"], e["dest"]) for e in evs if e["op"] == "rename"}
        for kind in KINDS:
            assert (f"{kind}-1", f"{kind}-2") in renames, kind
        replaced = [e for e in evs if e["op"] == "rename" and e["dest"] == "victim-regular.txt"]
        assert replaced and replaced[0]["expected"] is not None, "the replaced bytes were kept"
        assert "edited.txt" in [e["path"] for e in evs if e["op"] == "write"]
    finally:
        m.stop()
    check_clean(m)
    assert os.listdir(workspace / ".rw" / "staging") == []


@pytest.mark.parametrize("op", ["make", "rename"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_operation_in_flight_at_the_crash_on_any_kind_of_entry(
    workspace: Path, kind: str, op: str
) -> None:
    """The daemon dies inside the operation, after its syscall and before its ``done``
    record: recovery asks the tree whether it happened (docs/recovery.md)."""
    (workspace / "base.txt").write_bytes(b"linked\n")
    if op == "rename":
        KINDS[kind](workspace / "e1")  # made in the raw tree: the rename is the only op
    m = Mount(workspace, env={"RWFS_FAULT": "after_namespace_op"}).start()
    with pytest.raises(OSError):
        if op == "make":
            KINDS[kind](m.path / "e1")
        else:
            os.rename(m.path / "e1", m.path / "e2")
    assert m.wait_dead() == -9, m.log_text()

    m = Mount(workspace).start()
    try:
        _recovered_cleanly(m)
        name = "e1" if op == "make" else "e2"
        assert TYPE[kind](os.lstat(workspace / name).st_mode)
        evs = _events(m)
        if op == "rename":
            assert not os.path.lexists(workspace / "e1")
            got = [e for e in evs if e["op"] == "rename"]
            assert [(e["path"], e["dest"], e.get("recovered")) for e in got] == [("e1", "e2", True)]
        else:
            made = {
                "regular": "create",
                "dir": "mkdir",
                "symlink": "symlink",
                "hardlink": "link",
            }.get(kind, "create")
            got = [e for e in evs if e.get("path") == "e1"]
            assert [(e["op"], e.get("recovered")) for e in got][:1] == [(made, True)], got
    finally:
        m.stop()
    check_clean(m)
