"""``rwfs fsck`` and its cheaper modes: ``--sample N`` (N paths and N objects hashed, at
random) and ``--changed`` (only what the journal recorded since the last completed full or
``--changed`` run, ``meta`` ``b"fsck:lsn"``). Only the full check finds an old object
that rotted: these tests damage objects' bytes behind rwfs's back and see which mode
finds them."""

from __future__ import annotations

import errno
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import RWFS, Mount, rwfs_mounted

from rwfs.features import fsck as fsck_module
from rwfs.journal.store import Store


def rwfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RWFS, *args], capture_output=True, text=True, timeout=120)


def state_of(workspace: Path) -> Path:
    """The raw state directory: mounted, ``.rw`` is the control directory and the state is
    reached through the daemon's descriptor, as fsck reaches it."""
    if rwfs_mounted(str(workspace)):
        status = json.loads((workspace / ".rw" / "status").read_text())
        return Path(f"/proc/{status['pid']}/fd/{status['state_fd']}")
    return workspace / ".rw"


def meta(workspace: Path, key: bytes) -> int:
    store = Store(str(state_of(workspace) / "journal"), readonly=True)
    try:
        return store.meta_int(key)
    finally:
        store.close()


def object_holding(workspace: Path, data: bytes) -> Path:
    """The object file (``.rw/objects/ab/cdef…``) that holds ``data``."""
    digest = hashlib.sha256(data).hexdigest()
    path = workspace / ".rw" / "objects" / digest[:2] / digest[2:]
    assert path.read_bytes() == data
    return path


def damage(obj: Path) -> str:
    """Overwrite an object's bytes in place (same size: rot, not a cut); its digest name."""
    data = obj.read_bytes()
    with open(obj, "r+b") as f:
        f.write(bytes([data[0] ^ 0xFF]))
    return "sha256:" + obj.parent.name + obj.name


def write_twice(m: Mount, name: str) -> bytes:
    """Write ``name`` twice through the mount: its first bytes become an object."""
    first = f"{name}: first\n".encode()
    (m.path / name).write_bytes(first)
    (m.path / name).write_bytes(f"{name}: second\n".encode())
    return first


def counts(stdout: str) -> tuple[int, int, int, int]:
    """(paths checked, in the index, objects checked, listed), from fsck's summary line."""
    found = re.search(r"checked (\d+) of (\d+) paths and (\d+) of (\d+) objects", stdout)
    assert found, stdout
    p, pn, o, on = map(int, found.groups())
    return p, pn, o, on


def daemon_clean(m: Mount) -> None:
    assert "Traceback" not in m.log_text(), m.log_text()


def damaged_after_a_mount(workspace: Path) -> str:
    """Write a file twice through a mount, unmount, then damage the object of its older
    bytes: that object's digest."""
    m = Mount(workspace).start()
    try:
        old = write_twice(m, "a.txt")
    finally:
        m.stop()
    daemon_clean(m)
    return damage(object_holding(workspace, old))


def test_changed_hashes_only_what_is_newer_than_the_last_run(workspace: Path) -> None:
    """Through a real mount: a damaged object newer than the last completed run is found by
    --changed, one older is not (only the full check finds it), and each completed run
    moves the recorded point to the journal's LSN at its start."""
    m = Mount(workspace).start()
    try:
        old = write_twice(m, "a.txt")
        res = rwfs("fsck", str(workspace))  # mounted: through the daemon's descriptors
        assert res.returncode == 0, res.stdout + res.stderr
        assert "fsck: full check: checked" in res.stderr
        first_run = meta(workspace, b"fsck:lsn")
        assert first_run > 0
        new = write_twice(m, "b.txt")
    finally:
        m.stop()
    daemon_clean(m)
    assert meta(workspace, b"lsn") > first_run  # b.txt's events came after the run
    old_digest = damage(object_holding(workspace, old))
    new_digest = damage(object_holding(workspace, new))

    m = Mount(workspace).start()
    try:
        res = rwfs("fsck", "--changed", str(workspace))
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"object {new_digest} is damaged" in res.stdout
        assert old_digest not in res.stdout  # older than the last run: not read again
        assert f"fsck: changed since LSN {first_run}: checked " in res.stderr
        _, _, hashed, listed = counts(res.stderr)
        assert 1 <= hashed < listed  # (the empty file's bytes are an object too)
        second_run = meta(workspace, b"fsck:lsn")
        assert second_run > first_run  # a completed run is recorded, drift found or not
        again = rwfs("fsck", "--changed", str(workspace))
        # Nothing journaled since: neither damage is looked at, which is the limit of the
        # mode (documented): rot of objects older than the last run needs the full check.
        assert again.returncode == 0, again.stdout + again.stderr
        assert counts(again.stderr) == (0, 2, 0, listed)
        full = rwfs("fsck", str(workspace))
        assert full.returncode == 1
        assert f"object {old_digest} is damaged" in full.stdout
        assert f"object {new_digest} is damaged" in full.stdout
        assert "fsck: full check: checked" in full.stderr
        assert counts(full.stderr) == (2, 2, listed, listed)
    finally:
        m.stop()
    daemon_clean(m)


def test_changed_with_no_recorded_run_checks_everything(workspace: Path) -> None:
    digest = damaged_after_a_mount(workspace)
    assert meta(workspace, b"fsck:lsn") == 0
    res = rwfs("fsck", "--changed", str(workspace))
    assert res.returncode == 1
    assert f"object {digest} is damaged" in res.stdout
    assert "no completed fsck run is recorded, so --changed checked all" in res.stderr
    assert meta(workspace, b"fsck:lsn") == meta(workspace, b"lsn")


def test_sample_checks_n_and_records_nothing(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        firsts = [write_twice(m, f"f{i}.txt") for i in range(6)]
    finally:
        m.stop()
    daemon_clean(m)
    assert rwfs("fsck", str(workspace)).returncode == 0
    recorded = meta(workspace, b"fsck:lsn")
    m = Mount(workspace).start()
    try:
        write_twice(m, "later.txt")  # the journal moves past the recorded run
    finally:
        m.stop()
    daemon_clean(m)

    res = rwfs("fsck", "--sample", "3", str(workspace))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fsck: checked 3 of 7 paths and 3 of " in res.stderr
    assert "objects, a sample" in res.stderr
    listed = counts(res.stderr)[3]
    assert listed >= 7  # the seven first versions (and the empty file's bytes)
    assert meta(workspace, b"fsck:lsn") == recorded  # a sample is not a run to build on

    # A sample past the store's size hashes it all, and finds any damage.
    digest = damage(object_holding(workspace, firsts[0]))
    res = rwfs("fsck", "--sample", "1000", str(workspace))
    assert res.returncode == 1
    assert f"object {digest} is damaged" in res.stdout
    assert f"checked 7 of 7 paths and {listed} of {listed} objects, a sample" in res.stderr

    # Whatever N, every listed object's presence is checked: a lookup is cheap.
    object_holding(workspace, firsts[1]).unlink()
    gone = "sha256:" + hashlib.sha256(firsts[1]).hexdigest()
    res = rwfs("fsck", "--sample", "1", str(workspace))
    assert res.returncode == 1
    assert f"object {gone} is listed in the journal but missing" in res.stdout
    assert f"checked 1 of 7 paths and 1 of {listed} objects, a sample" in res.stderr
    assert meta(workspace, b"fsck:lsn") == recorded


def test_an_interrupted_run_records_nothing(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Mount(workspace).start()
    try:
        write_twice(m, "a.txt")
    finally:
        m.stop()
    daemon_clean(m)

    def interrupted(fd: int) -> tuple[str, int]:
        raise KeyboardInterrupt

    monkeypatch.setattr(fsck_module, "digest_fd", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fsck_module.fsck(str(workspace), str(workspace / ".rw"), changed=True)
    assert meta(workspace, b"fsck:lsn") == 0
    monkeypatch.undo()
    report = fsck_module.fsck(str(workspace), str(workspace / ".rw"), changed=True)
    assert report.problems == [] and report.recorded == meta(workspace, b"lsn") > 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sample", "0"], "argument --sample: 0 is not a positive whole number"),
        (["--sample", "abc"], "argument --sample: 'abc' is not a positive whole number"),
        (["--sample", "2", "--changed"], "argument --changed: not allowed with argument --sample"),
    ],
)
def test_bad_input_is_a_usage_error_and_changes_nothing(
    workspace: Path, args: list[str], words: str
) -> None:
    digest = damaged_after_a_mount(workspace)  # a run would report it, and record
    journal = workspace / ".rw" / "journal" / "data.mdb"
    before = journal.read_bytes()
    res = rwfs("fsck", *args, str(workspace))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("usage: rwfs fsck") and words in res.stderr, res.stderr
    assert res.stdout == "" and digest not in res.stderr
    assert journal.read_bytes() == before
    assert meta(workspace, b"fsck:lsn") == 0


def test_progress_is_shown_in_every_mode(tmp_path: Path) -> None:
    """Every 1000 items, whatever the mode, counted over what that mode reads (a journal
    of 1000 deleted paths and 1000 objects whose files are gone, built without a mount)."""
    state = tmp_path / "ws" / ".rw"
    (state / "intents").mkdir(parents=True)
    store = Store(str(state / "journal"))

    def fill(txn: Any) -> None:
        for n in range(1000):
            txn.set_path(b"gone%d" % n, None, n + 1)
            txn.add_object("sha256:" + hashlib.sha256(b"%d" % n).hexdigest(), 1, n + 1)
        txn.set_meta_int(b"lsn", 1000)

    store.write(fill)
    store.close()
    root = str(tmp_path / "ws")

    def shown(**mode: Any) -> list[str]:
        seen: list[str] = []
        fsck_module.fsck(root, str(state), progress=seen.append, **mode)
        return seen

    assert shown() == ["fsck: 1000/1000 paths", "fsck: 1000/1000 objects"]
    assert shown(sample=1000) == [
        "fsck: 1000/1000 paths",
        "fsck: 1000/1000 objects looked up",
        "fsck: 1000/1000 objects",
    ]
    # Recorded by the full run: nothing is newer, only the lookups are left to count.
    assert shown(changed=True) == ["fsck: 1000/1000 objects looked up"]


def test_changed_distrusts_a_record_past_the_journals_end(workspace: Path) -> None:
    """A journal put back from a copy older than the last run: --changed checks all."""
    digest = damaged_after_a_mount(workspace)
    lsn = meta(workspace, b"lsn")
    store = Store(str(workspace / ".rw" / "journal"))
    try:
        store.write(lambda txn: txn.set_meta_int(b"fsck:lsn", lsn + 100))
    finally:
        store.close()
    res = rwfs("fsck", "--changed", str(workspace))
    assert res.returncode == 1 and f"object {digest} is damaged" in res.stdout
    assert f"the recorded run (LSN {lsn + 100}) is past the journal's end" in res.stderr
    assert meta(workspace, b"fsck:lsn") == lsn


def test_a_failed_operation_leaves_nothing_to_recover_at_unmount(workspace: Path) -> None:
    """A namespace operation that is announced in the intent log and then fails (a
    directory renamed over one that is not empty) is cancelled there: a clean unmount
    leaves no generation for the next mount, and fsck finds nothing to recover."""
    m = Mount(workspace).start()
    try:
        for d in ("a", "b"):
            (m.path / d).mkdir()
        (m.path / "b" / "x").write_text("x\n")
        with pytest.raises(OSError) as err:
            (m.path / "a").rename(m.path / "b")
        assert err.value.errno == errno.ENOTEMPTY
    finally:
        m.stop()
    logs = workspace / ".rw" / "intents"
    assert [n.name for n in logs.iterdir() if n.stat().st_size] == []
    res = rwfs("fsck", str(workspace))
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in workspace.iterdir()) == [".rw", "a", "b"]
