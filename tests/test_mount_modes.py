"""Mount modes: a separate mount point, allow_other, and the kernel's forget."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from conftest import Mount, as_nobody, check_clean


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
