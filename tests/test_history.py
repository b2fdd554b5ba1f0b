"""History, snapshots, restore and undo (SPEC §8) through a real mount."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RWFS, Mount, check_clean, mounted_beside


def _ctl(m: Mount, text: str) -> None:
    (m.path / ".rw" / "ctl").write_text(text + "\n")


def _versions(m: Mount, path: str) -> list[str]:
    """The bytes of every version listed under .rw/history/<path>/, oldest first."""
    top = m.path / ".rw" / "history" / path
    return [(top / name).read_text() for name in sorted(p.name for p in top.iterdir())]


def _envelope(m: Mount) -> dict[str, object]:
    return dict(json.loads((m.path / ".rw" / "last-error").read_text()))


def test_history_lists_every_version_across_rename_and_delete(mount: Mount) -> None:
    src = mount.path / "src"
    src.mkdir()
    (src / "app.py").write_text("v1\n")
    (src / "app.py").write_text("v2\n")
    (src / "app.py").rename(src / "main.py")
    (src / "main.py").write_text("v3\n")
    (src / "main.py").unlink()
    # A new file's empty start is not a version once it has bytes.
    assert _versions(mount, "src/app.py") == ["v1\n", "v2\n"]
    # The new name carries the old one's versions; the deleted file's last bytes are kept.
    assert _versions(mount, "src/main.py") == ["v1\n", "v2\n", "v3\n"]
    names = sorted(p.name for p in (mount.path / ".rw" / "history" / "src" / "main.py").iterdir())
    assert all(n[:6].isdigit() and "T" in n for n in names)  # LSN first: ls sorts by time
    res = subprocess.run(
        [*RWFS, "log", "src/main.py", "-C", str(mount.path)], capture_output=True, text=True
    )
    assert res.returncode == 0 and "unlink" in res.stdout and "rename" in res.stdout


def test_history_lists_no_temporary_of_a_removed_target_after_a_directory_move(
    mount: Mount,
) -> None:
    """tests/test_model_features.py's flake, step by step: rsync-style saves, the
    target then removed (or replaced, moved and removed), ``d`` renamed away and back."""
    top = mount.path / "d"
    top.mkdir()
    for name, body in (("c.py", "saved\n"), ("a.py", "kept\n")):
        tmp = top / f".rsync.Q7x9Zk{name}"
        tmp.write_text(body)
        os.replace(tmp, top / name)
    (top / "b.py").write_text("other\n")
    os.replace(top / "b.py", top / "a.py")
    os.rename(top / "a.py", mount.path / "moved.py")
    (mount.path / "moved.py").unlink()
    (top / "c.py").unlink()
    os.rename(top, mount.path / "d.moved")
    os.rename(mount.path / "d.moved", top)
    hist = mount.path / ".rw" / "history"
    # Each save's temporary, and a.py and b.py, went on to a path listed with their bytes.
    assert os.listdir(hist / "d") == ["c.py"]
    assert sorted(os.listdir(hist)) == ["d", "moved.py"]
    assert _versions(mount, "d/c.py") == ["saved\n"]
    assert _versions(mount, "moved.py") == ["kept\n", "other\n"]


def test_history_starts_with_the_bytes_before_rwfs(workspace: Path) -> None:
    (workspace / "old.txt").write_text("from before the mount\n")
    m = Mount(workspace).start()
    try:
        (m.path / "old.txt").write_text("edited\n")
        assert _versions(m, "old.txt") == ["from before the mount\n", "edited\n"]
    finally:
        m.stop()
    check_clean(m)


def test_a_newest_version_lost_behind_the_mount_reads_as_an_error(tmp_path: Path) -> None:
    """The newest version of a file is kept only as the live file. Changed in the raw
    tree (beside a separate mount point), that version is gone: reading it fails with
    ESTALE and says why, rather than giving empty bytes."""
    ws, mp, m = mounted_beside(tmp_path)
    try:
        (mp / "a.txt").write_text("one\n")
        (mp / "a.txt").write_text("two\n")
        _ctl(m, "sync")
        (ws / "a.txt").write_text("changed behind rwfs\n")
        top = mp / ".rw" / "history" / "a.txt"
        oldest, newest = sorted(p.name for p in top.iterdir())[-2:]
        assert (top / oldest).read_text() == "one\n"
        with pytest.raises(OSError) as err:
            (top / newest).read_text()
        assert err.value.errno == errno.ESTALE
        envelope = _envelope(m)
        assert envelope["error"] == "stale_precondition" and "changed outside the mount" in str(
            envelope["message"]
        )
    finally:
        m.stop()


def test_snapshot_view_stays_put_while_files_change(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("then\n")
    (mount.path / "old.txt").write_text("gone later\n")
    (mount.path / ".rw" / "snapshots" / "s1").mkdir()
    (mount.path / "a.txt").write_text("now\n")
    (mount.path / "b.txt").write_text("new file\n")
    (mount.path / "old.txt").unlink()
    tree = mount.path / ".rw" / "snapshots" / "s1" / "tree"
    assert sorted(p.name for p in tree.iterdir()) == ["a.txt", "old.txt"]
    assert (tree / "a.txt").read_text() == "then\n"
    assert (tree / "old.txt").read_text() == "gone later\n"
    assert (mount.path / "a.txt").read_text() == "now\n"
    with pytest.raises(OSError):
        (tree / "a.txt").write_text("x")  # read-only
    info = json.loads((mount.path / ".rw" / "snapshots" / "s1" / "info").read_text())
    assert info["name"] == "s1" and isinstance(info["lsn"], int)


def test_restore_after_rm_rf_brings_the_tree_back(mount: Mount) -> None:
    src = mount.path / "src"
    (src / "pkg").mkdir(parents=True)
    files = {"src/a.py": "a = 1\n", "src/pkg/b.py": "b = 2\n", "src/pkg/c.txt": "c\n"}
    for rel, text in files.items():
        (mount.path / rel).write_text(text)
    (mount.path / ".rw" / "snapshots" / "good").mkdir()
    (mount.path / "src" / "a.py").write_text("a = 'broken'\n")
    (mount.path / "late.txt").write_text("made after the snapshot\n")
    shutil.rmtree(src)
    _ctl(mount, "restore good")
    status = (mount.path / ".rw" / "batches" / "restore-good" / "status").read_text()
    for rel, text in files.items():
        assert (mount.path / rel).read_text() == text, status
    assert not (mount.path / "late.txt").exists()  # it did not exist at the snapshot
    status = json.loads((mount.path / ".rw" / "batches" / "restore-good" / "status").read_text())
    assert status["state"] == "committed"
    # A restore is a batch: undoing it puts the tree back as it was before the restore.
    _ctl(mount, "undo restore-good")
    assert not src.exists() or not any(src.rglob("*.py"))
    assert (mount.path / "late.txt").read_text() == "made after the snapshot\n"


def test_restore_of_some_paths_only(mount: Mount) -> None:
    for name in ("a.txt", "b.txt"):
        (mount.path / name).write_text(f"{name} then\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    for name in ("a.txt", "b.txt"):
        (mount.path / name).write_text(f"{name} now\n")
    _ctl(mount, "restore s a.txt")
    assert (mount.path / "a.txt").read_text() == "a.txt then\n"
    assert (mount.path / "b.txt").read_text() == "b.txt now\n"


def test_restore_onto_a_hand_edited_file_is_a_conflict(workspace: Path, tmp_path: Path) -> None:
    point = tmp_path / "mnt"
    point.mkdir()
    m = Mount(workspace, point).start()
    try:
        (m.path / "f.txt").write_text("snap\n")
        (m.path / ".rw" / "snapshots" / "s").mkdir()
        (m.path / "f.txt").write_text("journaled\n")
        _ctl(m, "sync")
        (workspace / "f.txt").write_text("by hand\n")  # behind rwfs's back
        with pytest.raises(OSError) as err:
            _ctl(m, "restore s")
        assert err.value.errno == 116  # ESTALE: rwfs does not overwrite an unexpected version
        assert (m.path / "f.txt").read_text() == "by hand\n"
        found = [p.name for p in (m.path / ".rw" / "conflicts").iterdir()]
        infos = [json.loads((m.path / ".rw" / "conflicts" / c / "info").read_text()) for c in found]
        assert len(found) == 1, json.dumps(infos, indent=1)
        top = m.path / ".rw" / "conflicts" / found[0]
        assert (top / "intended").read_text() == "snap\n"
        assert (top / "actual").read_text() == "by hand\n"
        assert json.loads((top / "info").read_text())["batch"] == "restore-s"
        (top / "ctl").write_text("keep-actual\n")
    finally:
        m.stop()
    check_clean(m)


def test_undo_of_a_batch_and_undo_of_the_undo(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("a0\n")
    (mount.path / "b.txt").write_text("b0\n")
    (mount.path / ".rw" / "batches" / "edit").mkdir()
    (mount.path / "a.txt").write_text("a1\n")
    (mount.path / "b.txt").unlink()
    (mount.path / "c.txt").write_text("c1\n")
    (mount.path / ".rw" / "batches" / "edit" / "ctl").write_text("commit\n")
    _ctl(mount, "undo edit")
    assert (mount.path / "a.txt").read_text() == "a0\n"
    assert (mount.path / "b.txt").read_text() == "b0\n"
    assert not (mount.path / "c.txt").exists()
    _ctl(mount, "undo undo-edit")
    assert (mount.path / "a.txt").read_text() == "a1\n"
    assert not (mount.path / "b.txt").exists()
    assert (mount.path / "c.txt").read_text() == "c1\n"


def test_undo_of_a_changed_file_is_a_conflict_and_the_rest_is_undone(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("a0\n")
    (mount.path / "b.txt").write_text("b0\n")
    (mount.path / ".rw" / "batches" / "e").mkdir()
    (mount.path / "a.txt").write_text("a1\n")
    (mount.path / "b.txt").write_text("b1\n")
    (mount.path / ".rw" / "batches" / "e" / "ctl").write_text("commit\n")
    (mount.path / "b.txt").write_text("b2 later\n")
    with pytest.raises(OSError) as err:
        _ctl(mount, "undo e")
    assert err.value.errno == 116
    assert (mount.path / "a.txt").read_text() == "a0\n"
    assert (mount.path / "b.txt").read_text() == "b2 later\n"
    assert "conflict" in str(_envelope(mount)["message"])


def test_bad_input_to_undo_restore_and_snapshots(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("x\n")
    for verb in ("undo", "undo nosuch", "undo a b", "restore", "restore nosuch"):
        with pytest.raises(OSError) as err:
            _ctl(mount, verb)
        assert err.value.errno == 22, verb
        assert _envelope(mount)["errno"] == "EINVAL"
    snaps = mount.path / ".rw" / "snapshots"
    for bad in ("a b", "x" * 65):
        with pytest.raises(OSError):
            (snaps / bad).mkdir()
    (snaps / "ok").mkdir()
    with pytest.raises(FileExistsError):
        (snaps / "ok").mkdir()
    assert [p.name for p in snaps.iterdir()] == ["ok"]
    (snaps / "ok").rmdir()
    assert list(snaps.iterdir()) == []
    assert (mount.path / "a.txt").read_text() == "x\n"


def test_gc_keeps_what_snapshots_and_history_need(mount: Mount) -> None:
    f = mount.path / "a.txt"
    for i in range(4):
        f.write_text(f"v{i}\n")
        _ctl(mount, "sync")
    listed = _versions(mount, "a.txt")
    assert listed == ["v0\n", "v1\n", "v2\n", "v3\n"]
    # Within retain_days nothing goes.
    res = subprocess.run([*RWFS, "gc", str(mount.path)], capture_output=True, text=True)
    assert res.returncode == 0 and "removed 0 objects" in res.stdout, res.stdout + res.stderr
    assert _versions(mount, "a.txt") == listed
    # retain_days = 0: only what a snapshot, the live file or a conflict needs stays.
    pol = mount.path / ".rw" / "policy.toml"
    pol.write_text(pol.read_text().replace("retain_days = 30", "retain_days = 0"))
    (mount.path / ".rw" / "snapshots" / "s").mkdir()  # holds v3
    f.write_text("v4\n")
    res = subprocess.run([*RWFS, "gc", str(mount.path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    # (The new policy may have been applied by itself already: docs/history.md.)
    events = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    assert sum(e["removed"] for e in events if e["op"] == "gc") >= 3
    assert _versions(mount, "a.txt") == ["v3\n", "v4\n"]  # every listed version still reads
    assert (mount.path / ".rw" / "snapshots" / "s" / "tree" / "a.txt").read_text() == "v3\n"
    _ctl(mount, "restore s")
    assert f.read_text() == "v3\n"


def test_gc_keeps_refused_drafts_and_lists_only_what_it_kept(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    pol.write_text(pol.read_text().replace("retain_days = 30", "retain_days = 0"))
    good = "".join(f"def f{i}():\n    return {i}\n" for i in range(30))
    (mount.path / "m.py").write_text(good)
    with pytest.raises(OSError):
        (mount.path / "m.py").write_text(good.replace("f5():", "f5(:"))  # refused
    (draft,) = list((mount.path / ".rw" / "rejected").iterdir())
    (mount.path / "gone.txt").write_text("v1\n")
    (mount.path / "gone.txt").write_text("v2\n")
    (mount.path / "gone.txt").unlink()
    _ctl(mount, "gc")
    # A refused draft is never lost (SPEC I5).
    assert draft.read_text() == good.replace("f5():", "f5(:")
    # Every version still listed reads back; the deleted file's versions are gone.
    top = mount.path / ".rw" / "history"
    assert not (top / "gone.txt").exists() or all(
        p.read_bytes() for p in (top / "gone.txt").iterdir()
    )
    assert _versions(mount, "m.py") == [good]


def test_a_restored_file_gets_an_ordinary_mode(mount: Mount) -> None:
    (mount.path / "k.txt").write_text("k\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    (mount.path / "k.txt").unlink()
    _ctl(mount, "restore s")
    assert (mount.path / "k.txt").read_text() == "k\n"
    assert (mount.path / "k.txt").stat().st_mode & 0o777 == 0o644


def test_a_plain_delete_is_a_batch_of_one_that_undo_reverses(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("a\n")
    (mount.path / "a.txt").unlink()
    _ctl(mount, "sync")
    events = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    (gone,) = [e for e in events if e["op"] == "unlink"]
    assert str(gone["batch"]).startswith("auto-")
    _ctl(mount, f"undo {gone['batch']}")
    assert (mount.path / "a.txt").read_text() == "a\n"
    # A new file's creation is undone by removing it (if it still holds what it was made with).
    (mount.path / "empty.txt").touch()
    _ctl(mount, "sync")
    events = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    (made,) = [e for e in events if e["op"] == "create" and e["path"] == "empty.txt"]
    _ctl(mount, f"undo {made['batch']}")
    assert not (mount.path / "empty.txt").exists()


def _batch_of(m: Mount, op: str, path: str) -> str:
    _ctl(m, "sync")
    events = [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]
    return str([e for e in events if e["op"] == op and e["path"] == path][-1]["batch"])


def test_undo_of_sed_i_puts_the_file_back_without_its_temporary_file(mount: Mount) -> None:
    """sed -i writes a new temporary file and renames it over the file: undoing that
    rename gives the file its old bytes and does not make the temporary file again."""
    (mount.path / "a.txt").write_text("one\n")
    subprocess.run(["sed", "-i", "s/one/two/", "a.txt"], cwd=mount.path, check=True)
    assert (mount.path / "a.txt").read_text() == "two\n"
    names = sorted(p.name for p in mount.path.iterdir())
    _ctl(mount, "sync")
    journal = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    (rename,) = [e for e in journal if e["op"] == "rename" and e.get("dest") == "a.txt"]
    assert rename["path"].startswith("sed")
    _ctl(mount, f"undo {rename['batch']}")
    assert (mount.path / "a.txt").read_text() == "one\n"
    assert sorted(p.name for p in mount.path.iterdir()) == names == ["a.txt"]


def test_undo_of_a_rename_over_a_file_brings_both_back(mount: Mount) -> None:
    """mv of a file another process made: undo puts back both names. Only a file the
    renaming process made (and alone wrote) is taken as its temporary file."""
    (mount.path / "a.txt").write_text("a\n")
    (mount.path / "b.txt").write_text("b\n")
    subprocess.run(["mv", "a.txt", "b.txt"], cwd=mount.path, check=True)
    _ctl(mount, f"undo {_batch_of(mount, 'rename', 'a.txt')}")
    assert (mount.path / "a.txt").read_text() == "a\n"
    assert (mount.path / "b.txt").read_text() == "b\n"


def test_saves_by_rename_keep_the_target_in_snapshots_restore_and_history(
    workspace: Path,
) -> None:
    """sed -i and os.replace write a temporary and rename it over the target: the target
    existed throughout, its version 0 is its bytes before the mount, each save is one
    version, and the temporaries are not listed."""
    (workspace / "a.py").write_text("def a():\n    return 1\n")
    (workspace / "b.py").write_text("def b():\n    return 2\n")
    (workspace / "c.txt").write_text("c\n")
    m = Mount(workspace).start()
    try:
        (m.path / ".rw" / "snapshots" / "before").mkdir()
        for n in ("10", "100", "1000"):
            subprocess.run(
                ["sed", "-i", f"s/return 1.*/return {n}/", "a.py"], cwd=m.path, check=True
            )
        tmp = m.path / "b.tmp"
        tmp.write_text("def b():\n    return 20\n")
        tmp.replace(m.path / "b.py")
        (m.path / "c.txt").write_text("c2\n")
        tree = m.path / ".rw" / "snapshots" / "before" / "tree"
        assert sorted(p.name for p in tree.iterdir()) == ["a.py", "b.py", "c.txt"]
        assert (tree / "a.py").read_text() == "def a():\n    return 1\n"
        assert _versions(m, "a.py") == [
            f"def a():\n    return {n}\n" for n in ("1", "10", "100", "1000")
        ]
        assert _versions(m, "b.py") == ["def b():\n    return 2\n", "def b():\n    return 20\n"]
        listed = sorted(p.name for p in (m.path / ".rw" / "history").iterdir())
        assert listed == ["a.py", "b.py", "c.txt"], listed
        _ctl(m, "restore before")
        assert (m.path / "a.py").read_text() == "def a():\n    return 1\n"
        assert (m.path / "b.py").read_text() == "def b():\n    return 2\n"
        assert (m.path / "c.txt").read_text() == "c\n"
        assert sorted(p.name for p in m.path.iterdir()) == ["a.py", "b.py", "c.txt"]
    finally:
        m.stop()
    check_clean(m)


def test_a_snapshot_shows_a_fifo_and_a_device_as_empty_without_blocking(mount: Mount) -> None:
    """Reading a FIFO in a snapshot's tree/ must not wait for a writer (it held a worker
    thread), and a device node is never opened."""
    os.mkfifo(mount.path / "pipe")
    os.mknod(mount.path / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    (mount.path / "f.txt").write_text("f\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    tree = mount.path / ".rw" / "snapshots" / "s" / "tree"
    res = subprocess.run(
        ["cat", str(tree / "pipe"), str(tree / "null"), str(tree / "f.txt")],
        capture_output=True,
        timeout=20,
    )
    assert (res.returncode, res.stdout) == (0, b"f\n")


def test_a_journal_from_before_the_history_index_is_indexed_at_the_mount(
    workspace: Path,
) -> None:
    """A store an older rwfs wrote has events and no history index: the first mount
    indexes them (saying so in its log) and history/ lists what it listed before."""
    from rwfs.journal import timelines
    from rwfs.journal.store import Store, u64

    m = Mount(workspace).start()
    try:
        (m.path / "a.txt").write_text("one\n")
        (m.path / "a.txt").write_text("two\n")
        (m.path / "b.txt").write_text("gone\n")
        (m.path / "b.txt").unlink()
        subprocess.run(["sed", "-i", "s/two/three/", str(m.path / "a.txt")], check=True)
        before = {p: _versions(m, p) for p in ("a.txt", "b.txt")}
        listed = sorted(os.listdir(m.path / ".rw" / "history"))
    finally:
        m.stop()
    s = Store(str(workspace / ".rw" / "journal"))
    try:
        with s.env.begin(write=True) as txn:  # as an older rwfs left it
            for name in timelines.DBS:
                txn.drop(s.db[name], delete=False)
            txn.put(b"index:history", u64(0), db=s.db[b"meta"])
            txn.delete(b"index:history_lsn", db=s.db[b"meta"])
    finally:
        s.close()
    m = Mount(workspace).start()
    try:
        assert "indexing the history of" in m.log.read_text()
        assert {p: _versions(m, p) for p in ("a.txt", "b.txt")} == before
        assert before["a.txt"] == ["one\n", "two\n", "three\n"] and before["b.txt"] == ["gone\n"]
        assert sorted(os.listdir(m.path / ".rw" / "history")) == listed == ["a.txt", "b.txt"]
    finally:
        m.stop()
    check_clean(m)


def test_views_refreshed_once_a_change_still_show_each_change_at_once(mount: Mount) -> None:
    """history/ and a snapshot's tree/ are refreshed once per change of the journal (and,
    for a tree, of the live directory), not at every lookup below them: what they show
    follows each change right away, a passthrough file that no event names included."""
    d = mount.path / "d"
    d.mkdir()
    (d / "a.txt").write_text("one\n")
    hist = mount.path / ".rw" / "history" / "d" / "a.txt"
    assert len(os.listdir(hist)) == 1
    for i in range(3):
        [os.stat(hist / n) for n in os.listdir(hist)]  # lookups: no change, no refresh
        (d / "a.txt").write_text(f"again {i}\n")
        assert len(os.listdir(hist)) == 2 + i
    (mount.path / ".rw" / "snapshots" / "s1").mkdir()
    tree = mount.path / ".rw" / "snapshots" / "s1" / "tree" / "d"
    assert sorted(os.listdir(tree)) == ["a.txt"]
    (d / "x.log").write_text("passthrough: no event names it\n")
    assert sorted(os.listdir(tree)) == ["a.txt", "x.log"]
    (d / "b.txt").write_text("made after the snapshot\n")
    assert sorted(os.listdir(tree)) == ["a.txt", "x.log"]  # (journaled: not then)
    time.sleep(1.2)  # (the live directory's times are old enough to be trusted)
    assert sorted(os.listdir(tree)) == ["a.txt", "x.log"]
    (d / "x.log").unlink()
    assert sorted(os.listdir(tree)) == ["a.txt"]
    assert (tree / "a.txt").read_text() == "again 2\n"
    top = tree.parent  # the tree's top: the workspace's own directory
    assert sorted(os.listdir(top)) == ["d"]
    (mount.path / "top.log").write_text("passthrough\n")
    assert sorted(os.listdir(top)) == ["d", "top.log"]
