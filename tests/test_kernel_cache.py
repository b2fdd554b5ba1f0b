"""The kernel keeps directory listings (FOPEN_CACHE_DIR, set through rwfs.fuse._fuseopen): every
listing must still follow each change, whether it came through the mount or rwfs made it
itself (a batch's abort, a restore, an undo) or, beside a separate mount point, someone
changed the workspace directly. Each check lists a directory first, so that the kernel
holds it, then changes it and lists it again."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import time
from pathlib import Path

from conftest import Mount, check_clean, mounted_beside


def ls(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def ctl(m: Mount, verb: str) -> None:
    (m.path / ".rw" / "ctl").write_text(verb + "\n")


def test_listings_follow_what_rwfs_changes_itself(mount: Mount) -> None:
    d = mount.path / "d"
    d.mkdir()
    (d / "a.txt").write_text("a\n")
    assert ls(d) == ["a.txt"] and "d" in ls(mount.path)
    status = json.loads((mount.path / ".rw" / "status").read_text())
    assert status["no_opendir"] is True, "the kernel is not keeping listings"

    # A batch: its new file shows at once, its deletion hides the file; abort undoes both
    # behind the kernel's back.
    (mount.path / ".rw" / "batches" / "b").mkdir()
    (d / "new.txt").write_text("draft\n")
    (d / "a.txt").unlink()
    assert ls(d) == ["new.txt"]
    (mount.path / ".rw" / "batches" / "b" / "ctl").write_text("abort\n")
    assert ls(d) == ["a.txt"]

    # A restore after rm -rf makes the directory and its file again.
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    assert ls(mount.path) == ["d"]
    shutil.rmtree(d)
    assert ls(mount.path) == []
    ctl(mount, "restore s")
    assert ls(mount.path) == ["d"]
    assert ls(d) == ["a.txt"] and (d / "a.txt").read_text() == "a\n"

    # Undo of a batch that made a file deletes it: the listing loses it.
    (mount.path / ".rw" / "batches" / "late").mkdir()
    (d / "late.txt").write_text("late\n")
    (mount.path / ".rw" / "batches" / "late" / "ctl").write_text("commit\n")
    assert ls(d) == ["a.txt", "late.txt"]
    ctl(mount, "undo late")
    assert ls(d) == ["a.txt"]


def test_undo_of_a_deletion_shows_the_file_again(mount: Mount) -> None:
    """The kernel saw the file go (a negative entry, a listing without it); rwfs puts it
    back: both must be dropped."""
    f = mount.path / "f.txt"
    f.write_text("keep me\n")
    f.unlink()
    assert ls(mount.path) == [] and not f.exists()
    ctl(mount, "sync")
    deleted = [
        e["batch"]
        for e in map(json.loads, (mount.path / ".rw" / "journal").read_text().splitlines())
        if e["op"] == "unlink" and e["path"] == "f.txt"
    ]
    assert deleted, "the deletion was not journaled as a batch of one"
    ctl(mount, f"undo {deleted[-1]}")
    assert ls(mount.path) == ["f.txt"]
    assert f.read_text() == "keep me\n"


def lookups(m: Mount) -> int:
    """LOOKUPs answered so far (reading .rw/stats asks a few itself, the same each time)."""
    stats = json.loads((m.path / ".rw" / "stats").read_text())
    return int(stats["latency_ms"].get("op.lookup", {}).get("n", 0))


def test_an_absent_name_is_asked_once_and_every_way_of_making_it_shows(mount: Mount) -> None:
    """The kernel keeps a name the tree does not hold (a negative entry): looking again
    asks rwfs nothing. Every way a name is made then shows it at once: through the mount
    (the kernel's own requests), and by rwfs itself (a restore, an undo)."""
    base = -lookups(mount) + lookups(mount)  # what reading the counter itself asks
    before = lookups(mount)
    for _ in range(5):
        assert not (mount.path / "nope.txt").exists()
    assert lookups(mount) - before - base == 1

    (mount.path / "src.txt").write_text("src\n")
    makers = {
        "created": lambda p: p.write_text("new\n"),
        "made_dir": lambda p: p.mkdir(),
        "renamed": lambda p: (mount.path / "src.txt").rename(p),
        "linked": lambda p: os.link(p.with_name("renamed"), p),
        "symlinked": lambda p: p.symlink_to("renamed"),
        "fifo": lambda p: os.mkfifo(p),
    }
    for name, make in makers.items():
        p = mount.path / name
        assert not p.exists() and not p.exists()
        make(p)
        assert os.path.lexists(p), name

    # rwfs makes names behind the kernel: a restore brings back a removed directory and
    # the file in it, both of which the kernel had found absent.
    d = mount.path / "gone"
    d.mkdir()
    (d / "f.py").write_text("x = 1\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    shutil.rmtree(d)
    assert not (d / "f.py").exists() and not d.exists()
    ctl(mount, "restore s")
    assert (d / "f.py").read_text() == "x = 1\n"


def test_a_listing_follows_a_change_made_beside_the_mount(tmp_path: Path) -> None:
    """A separate mount point: the workspace can change under rwfs. The kernel asks again
    once the directory's attributes time out (1 s) and its mtime moved."""
    ws, mp, m = mounted_beside(tmp_path)
    try:
        assert ls(mp) == []
        (ws / "outside.txt").write_text("made directly\n")
        deadline = time.monotonic() + 10
        while ls(mp) != ["outside.txt"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ls(mp) == ["outside.txt"]
    finally:
        m.stop()
    check_clean(m)


def test_read_only_closes_send_no_flush(mount: Mount) -> None:
    """noflush: reading a file through the mount opens and releases it, with no flush."""
    (mount.path / "f.txt").write_text("x\n")

    def flushes() -> int:
        stats = json.loads((mount.path / ".rw" / "stats").read_text())
        return int(stats["latency_ms"].get("op.flush", {}).get("n", 0))

    before = flushes()
    for _ in range(20):
        assert (mount.path / "f.txt").read_text() == "x\n"
    after = flushes()
    # Reading .rw/stats is itself a flushed (control) file: allow for those two.
    assert after - before <= 2, (before, after)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _resident(path: Path) -> float:
    """The part of ``path``'s pages in the kernel's page cache, found without reading any
    (mincore on a mapping: no READ reaches the daemon)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_written_bytes_stay_in_the_kernels_cache(mount: Mount) -> None:
    """Over the workspace the kernel keeps the pages a write cached, although the write
    moved the file's mtime: the stat that fetches the new mtime drops none of them, so
    reading the file back is served from the cache. (Residency, not a count of READs: this
    machine's kernel gives back a few clean pages now and then, and a READ count would
    take that for rwfs dropping them.)"""
    f = mount.path / "f.bin"
    data = os.urandom(1 << 20)
    f.write_bytes(data)
    os.stat(f)  # fetches the new mtime: with auto_inval_data, this drops every page
    status = json.loads((mount.path / ".rw" / "status").read_text())
    assert status["written_pages_kept"] is True
    kept = _resident(f)
    assert kept >= 0.9, f"only {kept:.0%} of the written pages are still cached"
    assert f.read_bytes() == data
    # The measure sees a drop: the kernel's pages of the file given back, none are left.
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert _resident(f) < 0.1
    assert f.read_bytes() == data


def test_a_file_changed_beside_the_mount_reads_new_bytes(tmp_path: Path) -> None:
    """A separate mount point: the same size, a new mtime. Once the attributes time out
    (1 s) the kernel sees the mtime moved and drops the pages it kept."""
    ws, mp, m = mounted_beside(tmp_path)
    try:
        (mp / "f.txt").write_text("aaaa\n")
        assert (mp / "f.txt").read_text() == "aaaa\n"  # now in the kernel's cache
        ctl(m, "sync")
        st = os.stat(ws / "f.txt")
        (ws / "f.txt").write_text("bbbb\n")
        os.utime(ws / "f.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        deadline = time.monotonic() + 10
        while (mp / "f.txt").read_text() != "bbbb\n" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (mp / "f.txt").read_text() == "bbbb\n"
        status = json.loads((mp / ".rw" / "status").read_text())
        assert status["written_pages_kept"] is False
    finally:
        m.stop()
    # Not check_clean: the file changed behind rwfs on purpose, so fsck reports it.
    assert "Traceback" not in m.log_text()
