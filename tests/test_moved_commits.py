"""A save by temporary file and rename does not wait for a group (issue 18): the rename of a
file whose commit is still queued moves the commit with it, and a rename over a file whose
commit is still queued keeps that commit's bytes as a version. The journal tells each
write where it was made, then the rename, as a save that waited would; the history, undo
and a SIGKILL at any point of a run of such saves give the same answers as before."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

SLOW = DEFAULT_TEXT.replace("commit_interval_ms = 500", "commit_interval_ms = 60000")


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def version(n: int) -> bytes:
    return "".join(f"x_{i} = {n + 1000 if i == n % 50 else i}\n" for i in range(50)).encode()


def save(path: Path, data: bytes, tmp: str) -> None:
    """Write a temporary file next to ``path`` and rename it over ``path`` (os.replace)."""
    t = path.parent / tmp
    fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(t, path)


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def groups(m: Mount) -> int:
    """Group commits so far, counting the one this read itself makes of what is queued."""
    stats = json.loads((m.path / ".rw" / "stats").read_text())
    return int(stats["counts"].get("groups", 0))


def stages_holding(m: Mount, data: bytes) -> list[str]:
    """The daemon's descriptors of stages whose bytes are ``data``: counting them all
    would count spares too, made and taken in a thread of their own meanwhile."""
    assert m.proc is not None
    fds = Path(f"/proc/{m.proc.pid}/fd")
    out = []
    for n in os.listdir(fds):
        try:
            if "/.rw/staging/" in os.readlink(fds / n) and (fds / n).read_bytes() == data:
                out.append(n)
        except OSError:  # closed meanwhile, or not readable: not a stage of ours
            continue
    return out


def saves_in_journal(evs: list[dict], name: str) -> list[tuple[str, str, str]]:
    """Each save of ``name`` by a temporary: (the temporary, replaced digest, new digest),
    checking that the temporary's write comes before its rename and matches it (after a
    crash, recovery folds a write the rename moved before it landed into the rename's
    event: docs/recovery.md)."""
    out = []
    for i, e in enumerate(evs):
        if e["op"] == "rename" and e["dest"] == name and not e.get("recovered"):
            w = [x for x in evs[:i] if x["op"] == "write" and x["path"] == e["path"]]
            assert w and w[-1]["intended"] == e["intended"], (e, w)
        if e["op"] == "rename" and e["dest"] == name:
            out.append((e["path"], e.get("expected"), e["intended"]))
    return out


def test_saves_by_rename_queue_behind_each_other_and_journal_in_order(workspace: Path) -> None:
    prepare_state(workspace, SLOW)  # no group runs unless something waits for one
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        before = groups(m)
        for n in range(1, 11):
            save(f, version(n), f".m.py.tmp{n}")
            assert f.read_bytes() == version(n)
            assert not (m.path / f".m.py.tmp{n}").exists()
        assert groups(m) == before + 1, "a save waited for a group"
        assert sorted(p.name for p in m.path.iterdir()) == ["m.py"]  # (.rw is hidden)
        evs = journal(m)
        got = saves_in_journal(evs, "m.py")
        assert got == [
            (f".m.py.tmp{n}", sha(version(n - 1)), sha(version(n))) for n in range(1, 11)
        ]
        history = sorted((m.path / ".rw" / "history" / "m.py").iterdir())
        assert [p.read_bytes() for p in history] == [version(n) for n in range(11)]
        assert os.listdir(m.path / ".rw" / "history") == ["m.py"]  # (temporaries: unlisted)
        last = [e for e in evs if e["op"] == "rename"][-1]["batch"]
        (m.path / ".rw" / "ctl").write_text(f"undo {last}\n")
        assert f.read_bytes() == version(9)
    finally:
        m.stop()
    assert (workspace / "m.py").read_bytes() == version(9)
    assert sorted(p.name for p in workspace.iterdir()) == [".rw", "m.py"]
    check_clean(m)


def test_sed_in_place_and_mv_of_files_just_written(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    m = Mount(workspace).start()
    try:
        d = m.path
        (d / "a.py").write_bytes(version(1))  # queued
        subprocess.run(["sed", "-i", "s/x_3 = 3/x_3 = 33/", str(d / "a.py")], check=True)
        subprocess.run(["sed", "-i", "s/x_4 = 4/x_4 = 44/", str(d / "a.py")], check=True)
        want = version(1).replace(b"x_3 = 3\n", b"x_3 = 33\n").replace(b"x_4 = 4\n", b"x_4 = 44\n")
        assert (d / "a.py").read_bytes() == want
        (d / "b.txt").write_bytes(b"first\n")  # queued, then moved twice
        subprocess.run(["mv", str(d / "b.txt"), str(d / "c.txt")], check=True)
        os.rename(d / "c.txt", d / "e.txt")
        (d / "e.txt").write_bytes(b"first\nsecond\n")  # built on the moved commit
        assert (d / "e.txt").read_bytes() == b"first\nsecond\n"
        assert not (d / "b.txt").exists() and not (d / "c.txt").exists()
        evs = journal(m)
        assert len(saves_in_journal(evs, "a.py")) == 2
        ops = [(e["op"], e["path"], e.get("dest")) for e in evs if "txt" in e["path"]]
        assert ops == [
            ("create", "b.txt", None),
            ("write", "b.txt", None),
            ("rename", "b.txt", "c.txt"),
            ("rename", "c.txt", "e.txt"),
            ("write", "e.txt", None),
        ], ops
        versions = sorted((d / ".rw" / "history" / "e.txt").iterdir())
        assert [p.read_bytes() for p in versions][-2:] == [b"first\n", b"first\nsecond\n"]
    finally:
        m.stop()
    assert (workspace / "a.py").read_bytes() == want
    assert (workspace / "e.txt").read_bytes() == b"first\nsecond\n"
    check_clean(m)


def test_a_refused_rename_of_a_queued_temporary_changes_nothing(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        save(f, version(1), ".t1")  # m.py's version 1 is queued
        bad = version(2).replace(b"x_3 = 3\n", b"x_3 = (3\n")
        with pytest.raises(OSError) as exc:
            save(f, bad, ".t2")  # the temporary's commit is queued; its rename is refused
        assert exc.value.errno == errno.EBADMSG
        assert f.read_bytes() == version(1)
        assert (m.path / ".t2").read_bytes() == bad  # the temporary stays, as it was
        why = json.loads((m.path / ".rw" / "why" / "m.py").read_text())
        assert why["expected"] == sha(version(1)) and why["intended"] == sha(bad), why
        os.unlink(m.path / ".t2")
    finally:
        m.stop()
    assert (workspace / "m.py").read_bytes() == version(1)
    assert not (workspace / ".t2").exists()
    check_clean(m)


def test_a_descriptor_open_on_a_replaced_version_keeps_reading_it(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        save(f, version(1), ".t1")
        with open(f, "r+b") as old:  # the queued version 1
            save(f, version(2), ".t2")  # replaces it before it landed
            (m.path / ".rw" / "ctl").write_text("sync\n")
            assert old.read() == version(1)
            old.seek(0)
            old.write(b"# scribbled on the replaced file\n")
            old.flush()
            old.seek(0)
            assert old.read().startswith(b"# scribbled")
        assert f.read_bytes() == version(2)
        history = sorted((m.path / ".rw" / "history" / "m.py").iterdir())
        assert [p.read_bytes() for p in history] == [version(0), version(1), version(2)]
        save(f, version(3), ".t3")
        with open(f, "rb") as old:  # only read, this time: its stage is kept, then goes
            save(f, version(4), ".t4")  # replaces version 3 before it landed
            (m.path / ".rw" / "ctl").write_text("sync\n")
            assert old.read() == version(3)
            kept = stages_holding(m, version(3))
        # Its stage goes at the last close (the kernel sends that release after close()
        # returned: it is waited for).
        deadline = time.monotonic() + 20
        while len(stages_holding(m, version(3))) != len(kept) - 1:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(stages_holding(m, version(3))) == len(kept) - 1, kept
    finally:
        m.stop()
    assert (workspace / "m.py").read_bytes() == version(4)
    check_clean(m)


# A run of three saves by rename, each while the one before is queued; the daemon dies at
# a point of it: before or after a rename reached the tree (its "done" not written), or in
# the group that applies all of them.
@pytest.mark.parametrize("point", ["after_namespace_op:4", "after_namespace_op:6",
                                   "after_seal:3", "after_prepare", "after_rename:1",
                                   "before_commit_record"])  # fmt: skip
def test_a_crash_in_a_run_of_saves_by_rename(workspace: Path, point: str) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace, env={"RWFS_FAULT": point}).start()
    acked = [0]
    for n in (1, 2, 3):
        try:
            save(m.path / "m.py", version(n), f".t{n}")
            acked.append(n)
        except OSError:
            break
    try:
        (m.path / ".rw" / "ctl").write_text("sync\n")
    except OSError:
        pass  # the daemon died under us: that is the point
    assert m.wait_dead() == -9, m.log_text()

    m = Mount(workspace).start()
    try:
        now = (m.path / "m.py").read_bytes()
        held = [n for n in range(4) if version(n) == now]
        # A save whose rename did not return may have reached the tree.
        assert held and held[0] >= acked[-1], f"acknowledged {acked}, the file holds {held}"
        assert not list((m.path / ".rw" / "conflicts").iterdir()), "a save became a conflict"
        evs = journal(m)
        got = [(e, i) for (_, e, i) in saves_in_journal(evs, "m.py")]
        assert got == [(sha(version(n - 1)), sha(version(n))) for n in range(1, held[0] + 1)]
        if held[0] == 0:  # the first save never landed (a crash before it returned)
            assert not (m.path / ".rw" / "history" / "m.py").exists()
        else:
            history = sorted((m.path / ".rw" / "history" / "m.py").iterdir())
            assert [p.read_bytes() for p in history][-1] == now
            for n in range(1, held[0] + 1):  # every replaced version is kept, for undo
                assert version(n - 1) in [p.read_bytes() for p in history], n
        unsaved = {f".t{n}" for n in range(held[0] + 1, 4)}  # (made, never renamed)
        assert {p.name for p in m.path.iterdir()} <= {"m.py"} | unsaved
    finally:
        m.stop()
    check_clean(m)


def test_removing_a_file_whose_write_is_queued_keeps_the_write_as_a_version(
    workspace: Path,
) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        before = groups(m)
        f.write_bytes(version(1))  # queued
        (m.path / "n.txt").write_bytes(b"scratch\n")  # a new file, queued, then removed
        with open(f, "rb") as held:
            os.unlink(f)
            os.unlink(m.path / "n.txt")
            assert not f.exists() and not (m.path / "n.txt").exists()
            assert groups(m) == before + 1, "a removal waited for a group"
            assert held.read() == version(1)  # a removed file stays readable while open
        evs = journal(m)
        ops = [(e["op"], e.get("expected"), e.get("intended")) for e in evs if e["path"] == "m.py"]
        assert ops == [
            ("write", sha(version(0)), sha(version(1))),
            ("unlink", sha(version(1)), None),
        ]
        unlink = [e for e in evs if e["op"] == "unlink" and e["path"] == "m.py"][0]
        (m.path / ".rw" / "ctl").write_text(f"undo {unlink['batch']}\n")
        assert f.read_bytes() == version(1)
    finally:
        m.stop()
    assert (workspace / "m.py").read_bytes() == version(1)
    assert not (workspace / "n.txt").exists()
    check_clean(m)


def test_a_crash_after_removing_a_file_whose_write_is_queued(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace, env={"RWFS_FAULT": "after_unlink"}).start()
    (m.path / "m.py").write_bytes(version(1))  # queued
    with pytest.raises(OSError):
        os.unlink(m.path / "m.py")  # reaches the tree; the daemon dies before "done"
    assert m.wait_dead() == -9, m.log_text()
    m = Mount(workspace).start()
    try:
        assert not (m.path / "m.py").exists()
        assert not list((m.path / ".rw" / "conflicts").iterdir())
        unlink = [e for e in journal(m) if e["op"] == "unlink" and e["path"] == "m.py"]
        assert len(unlink) == 1 and unlink[0]["expected"] == sha(version(1)), unlink
        (m.path / ".rw" / "ctl").write_text(f"undo {unlink[0]['batch']}\n")
        assert (m.path / "m.py").read_bytes() == version(1)  # the version was kept
    finally:
        m.stop()
    check_clean(m)


def test_an_exchange_of_two_files_whose_writes_are_queued(workspace: Path) -> None:
    from test_posix import RENAME_EXCHANGE, renameat2

    prepare_state(workspace, SLOW)
    (workspace / "a.txt").write_bytes(b"first a\n")
    m = Mount(workspace).start()
    try:
        a, b = m.path / "a.txt", m.path / "b.txt"
        b.write_bytes(b"first b\n")  # queued only at the destination: it lands first
        renameat2(a, b, RENAME_EXCHANGE)
        assert (a.read_bytes(), b.read_bytes()) == (b"first b\n", b"first a\n")
        a.write_bytes(b"second a\n")  # queued, then both ways
        renameat2(a, b, RENAME_EXCHANGE)
        assert (a.read_bytes(), b.read_bytes()) == (b"first a\n", b"second a\n")
        evs = journal(m)
        assert [e["op"] for e in evs if e["path"] in ("a.txt", "b.txt")][-1] == "rename"
    finally:
        m.stop()
    assert (workspace / "a.txt").read_bytes() == b"first a\n"
    assert (workspace / "b.txt").read_bytes() == b"second a\n"
    check_clean(m)
