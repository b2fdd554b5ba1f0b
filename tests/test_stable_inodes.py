"""Inode numbers through real FUSE mounts: a tree file's number is its backing file's
``st_ino``, the same at every mount (git's index records it), and two live files never
share one (inodes.py, docs/architecture.md "Inode numbers").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Mount, check_clean

from rwfs.core.inodes import CONTROL, HIGH, LIMIT, InodeTable


def _tree(ws: Path, n: int) -> list[str]:
    names = []
    for i in range(n):
        name = f"d{i % 5}/f{i}.txt"
        (ws / name).parent.mkdir(exist_ok=True)
        (ws / name).write_text(f"file {i}\n")
        names.append(name)
    return names


def test_inode_numbers_are_the_same_after_a_remount(workspace: Path) -> None:
    names = _tree(workspace, 50)
    raw = {n: os.stat(workspace / n).st_ino for n in names}
    m = Mount(workspace).start()
    try:
        first = {n: os.stat(workspace / n).st_ino for n in names}
        dirs = {d: os.stat(workspace / d).st_ino for d in ("d0", "d1")}
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        # (looked up in another order: a number does not depend on it)
        second = {n: os.stat(workspace / n).st_ino for n in reversed(names)}
        assert {d: os.stat(workspace / d).st_ino for d in ("d0", "d1")} == dirs
        listed = {f"d0/{e.name}": e.inode() for e in os.scandir(workspace / "d0")}
        assert json.loads((workspace / ".rw" / "status").read_bytes())["high_inodes"] == 0
    finally:
        m.stop()
    check_clean(m)
    assert first == second == raw
    assert listed == {n: raw[n] for n in names if n.startswith("d0/")}


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),
    }
    res = subprocess.run(
        ["git", "-c", "core.untrackedCache=false", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_status_after_a_remount_re_reads_nothing(workspace: Path) -> None:
    """git's index records each file's st_ino: after a remount, `git status` finds every
    unchanged file's stat data as it was, so it neither re-reads them nor rewrites their
    entries (`git ls-files --debug` shows the entries' stat data)."""
    names = _tree(workspace, 200)
    old = 1_600_000_000  # well before the index is written: no racily clean entry
    for n in names:
        os.utime(workspace / n, (old, old))
    m = Mount(workspace).start()
    try:
        _git(workspace, "init", "-q")
        _git(workspace, "add", "-A")
        _git(workspace, "commit", "-q", "-m", "tree")
        assert _git(workspace, "status", "--porcelain") == ""
        before = _git(workspace, "ls-files", "--debug")
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        assert _git(workspace, "status", "--porcelain") == ""
        after = _git(workspace, "ls-files", "--debug")
    finally:
        m.stop()
    check_clean(m)
    assert after == before


def test_no_two_live_files_share_a_number(workspace: Path) -> None:
    """Commits replace backing inodes (a file keeps its number), new files come and
    go: every live file has its own number, each name's number is its open descriptor's,
    and hard links share one."""
    names = _tree(workspace, 20)
    m = Mount(workspace).start()
    held: list[int] = []
    try:
        for n in names:  # each commit gives the file a new backing inode
            fd = os.open(workspace / n, os.O_RDONLY)  # known to the kernel throughout
            held.append(fd)
            before = os.fstat(fd).st_ino
            (workspace / n).write_text(f"new {n}\n")
            assert os.stat(workspace / n).st_ino == before
        made = [f"new{i}.txt" for i in range(200)]
        for i, n in enumerate(made):
            (workspace / n).write_text(f"made {i}\n")
            if i % 3 == 0:
                os.unlink(workspace / n)
        os.link(workspace / names[0], workspace / "link.txt")
        live = [n for n in names + made + ["link.txt"] if (workspace / n).exists()]
        numbers: dict[int, str] = {}
        for n in live:
            ino = os.stat(workspace / n).st_ino
            if n == "link.txt":
                assert ino == os.stat(workspace / names[0]).st_ino
                continue
            assert ino not in numbers, f"{n} and {numbers[ino]} share inode {ino}"
            numbers[ino] = n
            fd = os.open(workspace / n, os.O_RDONLY)
            try:
                assert os.fstat(fd).st_ino == ino
                want = f"new {n}\n" if n in names else f"made {made.index(n)}\n"
                assert os.read(fd, 100).decode() == want
            finally:
                os.close(fd)
        assert all(1 < i < CONTROL for i in numbers)
    finally:
        for fd in held:
            os.close(fd)
        m.stop()
    check_clean(m)


def _fake(dev: int, ino: int) -> os.stat_result:
    return os.stat_result((0o100644, ino, dev, 1, 0, 0, 0, 0, 0, 0))


def test_a_kept_number_is_not_handed_to_the_file_that_reuses_its_backing_inode() -> None:
    """The table alone: a file keeps its number (its first backing st_ino) across a
    commit; the backing inode freed and reused by another file must not alias them."""
    t = InodeTable((7, 2))
    a = t.resolve(b"a", _fake(7, 100))
    a.lookups = 1
    assert a.ino == 100
    t.rekey(a, (7, 200))  # a commit: new backing inode, same number
    b = t.resolve(b"b", _fake(7, 100))  # the old inode, freed and reused
    assert b.ino != a.ino and b.ino >= HIGH
    c = t.resolve(b"c", _fake(9, 300))  # another device
    assert c.ino >= HIGH and c.ino not in (a.ino, b.ino)
    d = t.resolve(b"d", _fake(7, 1))  # the root's number
    assert d.ino >= HIGH and len({a.ino, b.ino, c.ino, d.ino}) == 4
    assert t.resolve(b"e", _fake(7, HIGH + 5)).ino >= HIGH  # out of the range
    assert t.allocate_control() >= CONTROL and t.allocate() < CONTROL <= LIMIT
    t.forget(a.ino, 1)  # forgotten: its number is free, its file gets its own again
    assert t.resolve(b"a", _fake(7, 200)).ino == 200


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_files_on_another_device_get_their_own_numbers(workspace: Path) -> None:
    """A file system mounted inside the workspace: its inode numbers may be any tree
    file's; they get numbers from the high range."""
    sub = workspace / "other"
    sub.mkdir()
    names = _tree(workspace, 30)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sub)], check=True)
    try:
        for i in range(30):
            (sub / f"g{i}.txt").write_text(f"other {i}\n")
        m = Mount(workspace).start()
        try:
            tree = {os.stat(workspace / n).st_ino for n in names}
            other = {os.stat(sub / f"g{i}.txt").st_ino for i in range(30)}
            assert len(tree) == 30 and len(other) == 30 and not tree & other
            assert all(HIGH <= i < CONTROL for i in other)
            assert (sub / "g3.txt").read_text() == "other 3\n"
            status = json.loads((workspace / ".rw" / "status").read_bytes())
            assert status["high_inodes"] >= 30
        finally:
            m.stop()
    finally:
        subprocess.run(["umount", "-l", str(sub)], check=False)


def test_control_entries_never_share_a_tree_file_number(workspace: Path) -> None:
    names = _tree(workspace, 20)
    m = Mount(workspace).start()
    try:
        (workspace / names[0]).write_text("changed\n")
        subprocess.run(["sync"], check=True)
        os.mkdir(workspace / ".rw" / "snapshots" / "s1")
        tree = {os.stat(workspace / n).st_ino for n in names}
        tree |= {e.inode() for e in os.scandir(workspace)}
        control: set[int] = set()
        for top, _, _ in os.walk(workspace / ".rw"):
            for e in os.scandir(top):
                assert e.inode() == os.stat(e.path, follow_symlinks=False).st_ino, e.path
                control.add(e.inode())
        control.add(os.stat(workspace / ".rw").st_ino)
        assert len(control) > 20
        assert not tree & control
        assert all(CONTROL <= i < LIMIT for i in control)
    finally:
        m.stop()
    check_clean(m)


def test_a_backing_inode_freed_by_gc_and_reused_aliases_nothing(tmp_path: Path) -> None:
    """A file keeps its number across commits while it is open; gc frees its first
    backing inode (no history kept), and files made in the raw tree then may get that
    very inode: none of them may get the number the open file keeps."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"  # mounted beside: the raw tree is readable
    ws.mkdir()
    mp.mkdir()
    names = _tree(ws, 40)
    m = Mount(ws, mp).start()
    held: dict[str, int] = {}
    try:
        pol = mp / ".rw" / "policy.toml"
        pol.write_text(pol.read_text().replace("retain_days = 30", "retain_days = 0"))
        first: dict[str, int] = {}
        for n in names:
            held[n] = os.open(mp / n, os.O_RDONLY)
            first[n] = os.fstat(held[n]).st_ino
            (mp / n).write_text(f"new {n}\n")
        with open(mp / ".rw" / "ctl", "w") as f:
            f.write("sync\n")
        with open(mp / ".rw" / "ctl", "w") as f:
            f.write("gc\n")
        kept = {first[n]: n for n in names}
        assert all(os.stat(mp / n).st_ino == first[n] for n in names)
        made = [f"new{i}.txt" for i in range(300)]
        for i, n in enumerate(made):  # in the raw tree: each is new to the inode table
            (ws / n).write_text(f"made {i}\n")
        reused = [n for n in made if os.stat(ws / n).st_ino in kept]
        numbers = {os.stat(mp / n).st_ino: n for n in made}
        assert len(numbers) == len(made)
        assert not set(numbers) & set(kept), [
            (numbers[i], kept[i]) for i in set(numbers) & set(kept)
        ]
        for n in names:
            assert os.fstat(held[n]).st_ino == first[n]
            assert (mp / n).read_text() == f"new {n}\n"
        for n in reused:  # (the backing file system's choice: often some are)
            assert os.stat(mp / n).st_ino >= HIGH
            assert (mp / n).read_text() == f"made {made.index(n)}\n"
        print(f"backing inodes reused: {len(reused)}")
    finally:
        for fd in held.values():
            os.close(fd)
        m.stop()
    check_clean(m)
