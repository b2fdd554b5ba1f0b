"""No verb follows a symlink or leaves the workspace (SPEC §3.3b, I6), through real mounts.

The attack: a writer through the mount moves a directory away and plants, under its name, a
symlink to a directory outside the workspace; then the owner runs a verb on a file of that
directory (restore, undo, a batch's commit, chunks' compose, a conflict's take-intended).
Every verb must fail with an envelope, or act on the directory where it now is, and never
touch the directory outside.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import RWFS, Mount

from rwfs.core.syscalls import renameat2

RENAME_EXCHANGE = 2


def rwfs(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RWFS, *args, "-C", str(cwd)], capture_output=True, text=True, timeout=120
    )


def _ctl(path: Path, text: str) -> None:
    path.write_text(text + "\n")


def _envelope(m: Mount) -> dict[str, object]:
    return dict(json.loads((m.path / ".rw" / "last-error").read_text()))


def _host(tmp_path: Path) -> Path:
    """A directory outside the workspace, with a file the attack aims at."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "f.txt").write_text("host file\n")
    return host


def _host_untouched(host: Path) -> None:
    assert sorted(os.listdir(host)) == ["f.txt"], os.listdir(host)
    assert (host / "f.txt").read_text() == "host file\n"


def _swap(m: Mount, host: Path) -> None:
    """Through the mount: ``d`` moves to ``d.moved``, and ``d`` becomes a symlink to
    ``host``."""
    os.rename(m.path / "d", m.path / "d.moved")
    os.symlink(host, m.path / "d")


def _refused(res: subprocess.CompletedProcess[str], m: Mount) -> None:
    assert res.returncode == 1, res.stdout + res.stderr
    env = _envelope(m)
    assert env["error"] == "policy_violation" and env["reason_hint"] == "symlink", env
    assert "symlink" in str(env["message"]), env


def _setup(m: Mount) -> None:
    (m.path / "d").mkdir()
    (m.path / "d" / "f.txt").write_text("v0\n")


def test_restore_and_undo_do_not_follow_a_planted_symlink(mount: Mount, tmp_path: Path) -> None:
    host = _host(tmp_path)
    _setup(mount)
    assert rwfs("snapshot", "s", cwd=mount.path).returncode == 0
    assert rwfs("batch", "begin", "b1", cwd=mount.path).returncode == 0
    (mount.path / "d" / "f.txt").write_text("v1\n")
    (mount.path / "d" / "new.txt").write_text("new\n")
    assert rwfs("batch", "commit", "b1", cwd=mount.path).returncode == 0
    _swap(mount, host)

    _refused(rwfs("restore", "s", "d/f.txt", cwd=mount.path), mount)
    _host_untouched(host)
    _refused(rwfs("restore", "s", cwd=mount.path), mount)  # the whole tree
    _host_untouched(host)
    _refused(rwfs("undo", "b1", cwd=mount.path), mount)
    _host_untouched(host)
    with pytest.raises(OSError) as err:
        _ctl(mount.path / ".rw" / "ctl", "restore s d/f.txt")
    assert err.value.errno == errno.EPERM
    _host_untouched(host)
    # The files are where the directory went, unchanged; no batch was made.
    assert (mount.path / "d.moved" / "f.txt").read_text() == "v1\n"
    assert (mount.path / "d.moved" / "new.txt").read_text() == "new\n"
    assert not (mount.path / ".rw" / "batches" / "restore-s").exists()
    assert not (mount.path / ".rw" / "batches" / "undo-b1").exists()
    # With the symlink gone and the directory back, the same verbs work.
    os.unlink(mount.path / "d")
    os.rename(mount.path / "d.moved", mount.path / "d")
    assert rwfs("restore", "s", "d/f.txt", cwd=mount.path).returncode == 0
    assert (mount.path / "d" / "f.txt").read_text() == "v0\n"
    _host_untouched(host)


def test_a_restore_into_a_removed_directory_does_not_follow_a_symlink(
    mount: Mount, tmp_path: Path
) -> None:
    host = _host(tmp_path)
    (mount.path / "d").mkdir()
    (mount.path / "d" / "sub").mkdir()
    (mount.path / "d" / "sub" / "g.txt").write_text("g\n")
    assert rwfs("snapshot", "s", cwd=mount.path).returncode == 0
    os.unlink(mount.path / "d" / "sub" / "g.txt")
    os.rmdir(mount.path / "d" / "sub")
    os.rmdir(mount.path / "d")
    os.symlink(host, mount.path / "d")  # restore would make d/sub/ and write g.txt there
    _refused(rwfs("restore", "s", "d/sub/g.txt", cwd=mount.path), mount)
    _host_untouched(host)
    assert not (host / "sub").exists()


def test_a_batch_commit_does_not_write_its_draft_through_a_symlink(
    mount: Mount, tmp_path: Path
) -> None:
    """A batch holds its drafts by path: the directory of one cannot be renamed away
    (EXDEV, as for any rename a batch would have to take; ``mv`` copies instead), so no
    symlink can take its place before the commit."""
    host = _host(tmp_path)
    _setup(mount)
    (mount.path / "e").mkdir()
    (mount.path / "e" / "g.txt").write_text("g0\n")
    assert rwfs("batch", "begin", "b2", cwd=mount.path).returncode == 0
    (mount.path / "d" / "f.txt").write_text("draft\n")
    os.unlink(mount.path / "e" / "g.txt")  # a deletion the batch holds
    for held in ("d", "e"):
        with pytest.raises(OSError) as err:
            os.rename(mount.path / held, mount.path / f"{held}.moved")
        assert err.value.errno == errno.EXDEV, held
    os.mkdir(mount.path / "free")
    os.rename(mount.path / "free", mount.path / "free.moved")  # nothing held below it
    res = rwfs("batch", "commit", "b2", cwd=mount.path)
    assert res.returncode == 0, res.stdout + res.stderr
    _host_untouched(host)
    assert (mount.path / "d" / "f.txt").read_text() == "draft\n"
    assert not (mount.path / "e" / "g.txt").exists()
    os.rename(mount.path / "d", mount.path / "d.moved")  # the batch is done: free again
    assert (mount.path / "d.moved" / "f.txt").read_text() == "draft\n"


def test_compose_does_not_write_through_a_symlink(mount: Mount, tmp_path: Path) -> None:
    host = _host(tmp_path)
    _setup(mount)
    chunks = mount.path / ".rw" / "chunks" / "c1"
    chunks.mkdir()
    (chunks / "part-001").write_text("composed\n")
    _swap(mount, host)
    for target in ("d/f.txt", "d/other.txt"):
        with pytest.raises(OSError) as err:
            _ctl(chunks / "ctl", f"compose {target}")
        assert err.value.errno == errno.EPERM, target
        env = _envelope(mount)
        assert env["reason_hint"] == "symlink", env
        _host_untouched(host)
    assert (mount.path / "d.moved" / "f.txt").read_text() == "v0\n"


def test_take_intended_does_not_write_through_a_symlink(workspace: Path, tmp_path: Path) -> None:
    host = _host(tmp_path)
    m = Mount(workspace).start()
    try:
        _setup(m)
        assert rwfs("snapshot", "s", cwd=m.path).returncode == 0
        (m.path / "d" / "f.txt").write_text("v1\n")
    finally:
        m.stop()
    (workspace / "d" / "f.txt").write_text("edited by hand\n")  # behind rwfs's back
    m = Mount(workspace).start()
    try:
        rwfs("restore", "s", "d/f.txt", cwd=m.path)  # meets the hand edit: a conflict
        listed = rwfs("conflicts", "--json", cwd=m.path).stdout.splitlines()
        assert len(listed) == 1, listed
        cid = str(json.loads(listed[0])["id"])
        _swap(m, host)
        _refused(rwfs("conflicts", "resolve", cid, "take-intended", cwd=m.path), m)
        _host_untouched(host)
        assert (m.path / "d.moved" / "f.txt").read_text() == "edited by hand\n"
    finally:
        m.stop()


def test_a_swap_racing_the_verbs_never_reaches_outside(mount: Mount, tmp_path: Path) -> None:
    """A writer swaps ``d`` between the directory and a symlink to the host as fast as it
    can while the owner restores and undoes over and over: whatever each verb meets, the
    host's directory is never written."""
    host = _host(tmp_path)
    _setup(mount)
    assert rwfs("snapshot", "s", cwd=mount.path).returncode == 0
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        # Exchanged atomically: ``d`` is never absent (a restore would make it anew).
        os.symlink(host, mount.path / "d.link")
        fd = os.open(mount.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                renameat2(fd, b"d", fd, b"d.link", RENAME_EXCHANGE)
                swaps[0] += 1
        finally:
            os.close(fd)

    t = threading.Thread(target=swapper)
    t.start()
    restores = 0
    # Bounded in time too: under this flood a restore can take 15-20 s (docs/known-gaps.md),
    # and 15 of them would pass the test's timeout, which ends the whole suite.
    deadline = time.monotonic() + 90
    try:
        while restores < 15 and (restores < 3 or time.monotonic() < deadline):
            rwfs("restore", "s", "d/f.txt", cwd=mount.path)
            restores += 1
            _host_untouched(host)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not t.is_alive()
    assert swaps[0] > 0 and restores >= 3
    _host_untouched(host)
