"""Mount modes: a separate mount point, allow_other, and the kernel's forget."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import RWFS, Mount, as_nobody, check_clean, rwfs_mounted


def status(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "status").read_text())


def test_separate_mountpoint_shows_the_workspace_and_keeps_it_reachable(tmp_path: Path) -> None:
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    (ws / "a.txt").write_text("one\n")
    m = Mount(ws, mp).start()
    try:
        assert (mp / "a.txt").read_text() == "one\n"
        (mp / "a.txt").write_text("two\n")
        (mp / ".rw" / "ctl").write_text("sync\n")
        assert (ws / "a.txt").read_text() == "two\n"  # the raw tree, reachable beside it
        assert status(m)["mountpoint"] == str(mp) and status(m)["workspace"] == str(ws)
        assert ".rw" not in [p.name for p in mp.iterdir()]
    finally:
        m.stop()
    check_clean(m)


def test_allow_other_lets_other_users_in_with_their_permissions() -> None:
    # pytest's own temporary directories are private (0700): use one others can enter.
    top = Path(tempfile.mkdtemp(prefix="rwfs-allow-other-"))
    try:
        _allow_other(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _allow_other(top: Path) -> None:
    top.chmod(0o755)
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    (ws / "public.txt").write_text("hello\n")
    (ws / "public.txt").chmod(0o644)
    (ws / "secret.txt").write_text("root only\n")
    (ws / "secret.txt").chmod(0o600)
    m = Mount(ws).start()
    try:
        # Without allow_other, FUSE lets no other user in at all.
        assert as_nobody(f"cat {ws}/public.txt").returncode != 0
    finally:
        m.stop()
    m = Mount(ws, options=("allow_other",)).start()
    try:
        ok = as_nobody(f"cat {ws}/public.txt")
        assert ok.returncode == 0 and ok.stdout == "hello\n"
        denied = as_nobody(f"cat {ws}/secret.txt")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        assert as_nobody(f"echo x > {ws}/public.txt").returncode != 0
        assert (ws / "public.txt").read_text() == "hello\n"
    finally:
        m.stop()
    check_clean(m)


def test_forget_releases_inodes_the_kernel_dropped(mount: Mount) -> None:
    for i in range(300):
        (mount.path / f"f{i}").write_text(str(i))
    (mount.path / ".rw" / "ctl").write_text("sync\n")
    many = status(mount)["inodes"]
    assert many > 300
    # The kernel forgets its dentries and inodes; an inode with cached pages (written
    # pages stay cached) is only evicted once they are dropped too, hence 3, not 2.
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    few = status(mount)["inodes"]
    assert few < 50, f"{few} inodes still held after the kernel forgot them"
    assert [(mount.path / f"f{i}").read_text() for i in (0, 299)] == ["0", "299"]


def test_a_given_fsname_wins_and_the_type_stays_rwfs(workspace: Path) -> None:
    m = Mount(workspace, options=("fsname=myproject", "subtype=other")).start()
    try:
        with open("/proc/self/mounts") as f:
            mine = [ln.split() for ln in f if ln.split()[1] == str(m.path)]
        assert [(ln[0], ln[2]) for ln in mine] == [("myproject", "fuse.rwfs")], mine
    finally:
        m.stop()
    check_clean(m)


OLD = (1_000_000_000, 1_500_000_000)  # (atime, mtime): a read moves such an atime


def _aged(ws: Path) -> None:
    """Files and a directory with an old atime (older than mtime), before the mount."""
    (ws / "d").mkdir()
    (ws / "d" / "x").write_text("x\n")
    (ws / "a.txt").write_text("one\n")
    (ws / "b.log").write_text("passthrough\n")  # (*.log: plain in-place writes)
    (ws / "c.py").write_text("x = 1\n")
    for p in ("d", "a.txt", "b.log", "c.py"):
        os.utime(ws / p, OLD)


def _atime(p: Path) -> float:
    return os.stat(p).st_atime


def test_a_write_moves_no_atime(workspace: Path) -> None:
    _aged(workspace)
    m = Mount(workspace).start()
    try:
        with open(m.path / "a.txt", "a") as f:  # an append reads nothing
            f.write("two\n")
        (m.path / ".rw" / "ctl").write_text("sync\n")
        assert _atime(m.path / "a.txt") == OLD[0]
        assert os.stat(m.path / "a.txt").st_mtime > OLD[1]
        (m.path / "c.py").write_text("x = 1\n")  # the same bytes again: a noop
        assert _atime(m.path / "c.py") == OLD[0]
        assert os.stat(m.path / "c.py").st_mtime > OLD[1]
        os.utime(m.path / "c.py", OLD)
        with pytest.raises(OSError):  # refused: rwfs's gates read it, its users did not
            with open(m.path / "c.py", "a") as f:
                f.write("def (:\n")
        assert _atime(m.path / "c.py") == OLD[0]
    finally:
        m.stop()
    check_clean(m)


def test_noatime_keeps_every_atime(workspace: Path) -> None:
    _aged(workspace)
    m = Mount(workspace, options=("noatime",)).start()
    try:
        with open("/proc/self/mounts") as f:
            assert "noatime" in next(ln for ln in f if ln.split()[1] == str(m.path))
        assert (m.path / "b.log").read_text() == "passthrough\n"
        assert sorted(os.listdir(m.path / "d")) == ["x"]
        with open(m.path / "a.txt", "a") as f:
            f.write("two\n")
        with pytest.raises(OSError):  # refused: c.py would not parse any more
            with open(m.path / "c.py", "a") as f:
                f.write("def (:\n")
        assert (m.path / "a.txt").read_text() == "one\ntwo\n"
        (m.path / ".rw" / "ctl").write_text("sync\n")
        for p in ("b.log", "d", "a.txt", "c.py"):
            assert _atime(m.path / p) == OLD[0], p
    finally:
        m.stop()
    check_clean(m)


def test_atime_options_libfuse_refuses_are_kept_by_rwfs(workspace: Path) -> None:
    _aged(workspace)
    m = Mount(workspace, options=("relatime", "nodiratime", "lazytime")).start()
    try:
        assert sorted(os.listdir(m.path / "d")) == ["x"]
        assert _atime(m.path / "d") == OLD[0]  # nodiratime: a listing moves no atime
        assert sorted(status(m)["options"]) == ["lazytime", "nodiratime", "relatime"]
    finally:
        m.stop()
    check_clean(m)


def _mount_cli(ws: Path, *opts: str) -> subprocess.CompletedProcess[str]:
    cmd = [*RWFS, "mount", str(ws)] + [a for o in opts for a in ("-o", o)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_refused_mount_option_is_named_with_libfuses_reason(workspace: Path) -> None:
    # kernel_cache is a high-level libfuse option: fuse_session_new refuses it.
    res = _mount_cli(workspace, "kernel_cache,allow_other")
    assert res.returncode == 1 and not rwfs_mounted(str(workspace))
    assert "FUSE does not know the mount option(s) kernel_cache (libfuse: " in res.stderr
    assert "fuse_session_new" not in res.stderr and "doctor" not in res.stderr, res.stderr
    res = _mount_cli(workspace, "strictatime")
    assert res.returncode == 1 and not rwfs_mounted(str(workspace))
    assert "-o strictatime cannot be kept" in res.stderr, res.stderr
    assert not (workspace / ".rw").exists()  # nothing was made
