"""The fast path (issue 31): files of passthrough paths only, opened through a real mount,
are read, written and mapped by the kernel itself (FUSE passthrough), and never at the cost
of a decision rwfs has to make: a journaled name is never written around its stage, and a
rename, link or policy that would give a passed-through open file one is refused (EBUSY)
with nothing changed. Every write pattern gives the bytes a plain directory gives, with the
fast path on (the default) and off (``-o fastpath=off``)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RWFS, Mount, check_clean

# What this kernel and these privileges allow: FUSE passthrough is Linux 6.9's, and a
# backing file needs CAP_SYS_ADMIN (root here; CI runs as root).
_KERNEL = tuple(int(x) for x in os.uname().release.split(".")[:2])
PASSES = os.geteuid() == 0 and _KERNEL >= (6, 9)
ON = ("fastpath=on",)


@pytest.fixture
def mount(workspace: Path) -> Iterator[Mount]:
    """A workspace mounted over itself with the fast path on; checked clean after."""
    m = Mount(workspace, options=ON).start()
    try:
        yield m
    finally:
        m.stop()
    check_clean(m)


def status(m: Mount) -> dict:
    return json.loads((m.path / ".rw" / "status").read_text())


def requests(m: Mount, op: str) -> int:
    stats = json.loads((m.path / ".rw" / "stats").read_text())
    return stats["latency_ms"].get(f"op.{op}", {}).get("n", 0)


def opens(m: Mount) -> int:
    return int(status(m)["passthrough"]["opens"])


@pytest.fixture(params=["on", "off"])
def both(request: pytest.FixtureRequest, workspace: Path) -> Iterator[Mount]:
    """A mount with the fast path on and one with it off."""
    (workspace / ".git").mkdir()
    options = ("fastpath=off",) if request.param == "off" else ON
    m = Mount(workspace, options=options).start()
    try:
        yield m
    finally:
        m.stop()
    check_clean(m)


def every_way_of_writing(top: Path) -> dict[str, bytes]:
    """Write .git/ files in place, O_TRUNC, appending, by pwrite, through a mapping, by
    truncate(2) and ftruncate, with two descriptors at once; what a plain directory holds
    after the same is returned."""
    g = top / ".git"
    with open(g / "whole", "wb") as f:
        f.write(b"first\n" * 1000)
    with open(g / "whole", "wb") as f:  # O_TRUNC over it
        f.write(b"second\n")
    with open(g / "log", "ab") as f:
        for i in range(50):
            f.write(b"line %d\n" % i)
    fd = os.open(g / "pw", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"x" * 8192, 0)
    os.pwrite(fd, b"HOLE", 1 << 20)  # a hole, then bytes past it
    os.ftruncate(fd, 5000)
    os.close(fd)
    with open(g / "mapped", "wb") as f:
        f.write(b"\0" * 4096)
    with open(g / "mapped", "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[100:105] = b"MAPPD"
    os.truncate(g / "whole", 3)
    # Two descriptors of one file: a write through one is read through the other at once.
    a = os.open(g / "shared", os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open(g / "shared", os.O_RDONLY)
    os.write(a, b"seen at once")
    seen = os.pread(b, 100, 0)
    os.close(a)
    os.close(b)
    assert seen == b"seen at once"
    return {p.name: p.read_bytes() for p in sorted(g.iterdir())}


def test_every_write_pattern_gives_a_plain_directorys_bytes(both: Mount, tmp_path: Path) -> None:
    native = tmp_path / "native"
    (native / ".git").mkdir(parents=True)
    expected = every_way_of_writing(native)
    before = requests(both, "write")
    got = every_way_of_writing(both.path)
    assert got == expected
    on = "fastpath=off" not in both.options
    if on and PASSES:
        assert status(both)["passthrough"]["on"] is True
        assert opens(both) >= 10
        # Not one WRITE of those files reached rwfs: the kernel wrote the backing files.
        assert requests(both, "write") == before
    else:
        assert opens(both) == 0
        assert requests(both, "write") > before


def test_a_journaled_file_is_never_passed_through(workspace: Path) -> None:
    (workspace / ".git").mkdir()
    (workspace / ".git" / "linked").write_bytes(b"two names\n")
    os.link(workspace / ".git" / "linked", workspace / "linked.txt")  # (before the mount)
    m = Mount(workspace, options=ON).start()
    try:
        (m.path / ".git" / "x").write_bytes(b"passthrough\n")
        passed = opens(m)
        assert passed == (1 if PASSES else 0)
        (m.path / "src.py").write_text("x = 1\n")
        with open(m.path / "src.py", "a") as f:
            f.write("y = 2\n")
        assert (m.path / "src.py").read_text() == "x = 1\ny = 2\n"
        assert opens(m) == passed  # its opens are rwfs's: its writes go to a stage
        assert len(os.listdir(m.path / ".rw" / "history" / "src.py")) == 2
        # A file that rwfs has not seen every name of (a hard link not looked up) stays
        # rwfs's too: its other name may be journaled.
        assert (m.path / ".git" / "linked").read_bytes() == b"two names\n"
        assert opens(m) == passed
    finally:
        m.stop()
    check_clean(m)


def refused_envelope(m: Mount) -> dict:
    env = json.loads((m.path / ".rw" / "last-error").read_text())
    assert env["reason_hint"] == "passthrough_open" and env["errno"] == "EBUSY", env
    return env


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_an_open_passed_through_file_never_gets_a_journaled_name(mount: Mount) -> None:
    g = mount.path / ".git"
    g.mkdir()
    (g / "sub").mkdir()
    held = open(g / "sub" / "obj", "wb")
    held.write(b"written by the kernel\n")
    held.flush()
    assert opens(mount) >= 1
    # A rename, a link, a directory's rename, a policy: each would journal it. Refused,
    # nothing changed.
    for attempt in (
        lambda: os.rename(g / "sub" / "obj", mount.path / "obj.py"),
        lambda: os.link(g / "sub" / "obj", mount.path / "obj.txt"),
        lambda: os.rename(g / "sub", mount.path / "sub"),
    ):
        with pytest.raises(OSError) as err:
            attempt()
        assert err.value.errno == errno.EBUSY
        assert "journaled name" in refused_envelope(mount)["message"]
    policy = mount.path / ".rw" / "policy.toml"
    old_policy = policy.read_bytes()
    with pytest.raises(OSError) as err:
        policy.write_text('passthrough = ["*.log"]\n')
    assert err.value.errno == errno.EBUSY
    assert policy.read_bytes() == old_policy
    assert sorted(os.listdir(mount.path)) == [".git"]
    # Within passthrough paths it moves and links freely, open or not.
    os.rename(g / "sub" / "obj", g / "obj")
    os.link(g / "obj", g / "obj2")
    held.write(b"and more\n")
    held.close()
    assert (g / "obj2").read_bytes() == b"written by the kernel\nand more\n"
    # Closed, the same rename is a journaled one.
    os.unlink(g / "obj2")
    os.rename(g / "obj", mount.path / "obj.txt")
    assert (mount.path / "obj.txt").read_bytes() == b"written by the kernel\nand more\n"
    with open(mount.path / "obj.txt", "ab") as f:
        f.write(b"journaled now\n")
    assert len(os.listdir(mount.path / ".rw" / "history" / "obj.txt")) >= 1
    assert opens(mount) == status(mount)["passthrough"]["opens"]
    assert status(mount)["passthrough"]["files"] == 0  # every backing id let go


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_passed_through_close_is_answered_in_c_and_seen_by_every_decision(
    mount: Mount,
) -> None:
    """A passed-through handle's RELEASE never reaches Python's request path; the next
    request, or decision about the file, sees it let go: a rename to a journaled name
    right after the close is no EBUSY, the backing ids and descriptors go, and the kernel's
    forgetting drops the inodes."""
    d = mount.path / "node_modules" / "pkg"
    d.mkdir(parents=True)
    (d / "warm").write_bytes(b"w")  # (the first request counters exist)
    s0 = status(mount)
    before = requests(mount, "release"), s0["passthrough"]["release_answers"], s0["open_handles"]
    for k in range(40):
        with open(d / f"f{k}.js", "wb") as f:
            f.write(b"module.exports = %d;\n" % k)
        with open(d / f"f{k}.js", "rb") as f:  # a read-only open, passed through too
            assert f.read() == b"module.exports = %d;\n" % k
    s1 = status(mount)
    # Python answered none of the 80: two are the .rw/ reads' own (status, stats)
    assert requests(mount, "release") - before[0] <= 2
    assert s1["passthrough"]["release_answers"] - before[1] == 80
    assert s1["open_handles"] == before[2]
    assert s1["passthrough"]["files"] == 0  # every backing id let go
    # Closed just now, journaled at once (the close's release was taken first).
    for k in range(40):
        fd = os.open(d / f"g{k}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"moved %d\n" % k)
        os.close(fd)
        os.rename(d / f"g{k}", mount.path / f"g{k}.txt")
    assert all((mount.path / f"g{k}.txt").read_bytes() == b"moved %d\n" % k for k in range(40))
    assert len(os.listdir(mount.path / ".rw" / "history" / "g7.txt")) >= 1
    # The kernel forgets what it no longer caches: each inode is dropped, none is held
    # by a handle Python was never told of.
    for name in os.listdir(d):
        os.unlink(d / name)
    inodes = status(mount)["inodes"]
    Path("/proc/sys/vm/drop_caches").write_text("2\n")
    assert status(mount)["inodes"] < inodes - 40


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_removed_file_stays_readable_and_syncable_through_its_open(mount: Mount) -> None:
    g = mount.path / ".git"
    g.mkdir()
    fd = os.open(g / "tmp", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"before the unlink\n")
        os.unlink(g / "tmp")
        os.write(fd, b"after it\n")
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"before the unlink\nafter it\n"
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    assert not (g / "tmp").exists()
    assert status(mount)["passthrough"]["files"] == 0


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_the_fast_path_is_on_unless_switched_off(workspace: Path) -> None:
    seen = {}
    for options in ((), ("fastpath=off",)):
        m = Mount(workspace, options=options)
        m.options = options  # (not the run's RWFS_TEST_FASTPATH: the default itself)
        m.start()
        try:
            seen[options] = status(m)["passthrough"]["on"]
        finally:
            m.stop()
        check_clean(m)
    assert seen == {(): True, ("fastpath=off",): False}


def test_the_switch_is_checked(workspace: Path) -> None:
    res = subprocess.run(
        [*RWFS, "mount", "-o", "fastpath=maybe", str(workspace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0
    assert "fastpath=maybe is not a switch" in res.stderr
    assert not (workspace / ".rw").exists()  # nothing was made


# vfs_cap_data, revision 2, effective: cap_net_raw (13) permitted.
CAP = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_passed_through_write_asks_no_python_about_capabilities(mount: Mount) -> None:
    """The kernel asks for security.capability before each write it passes through; the
    extension answers from the backing file, so such writes cost the daemon nothing."""
    d = mount.path / "node_modules" / "pkg"
    d.mkdir(parents=True)
    before = requests(mount, "getxattr"), status(mount)["passthrough"]["capability_answers"]
    with open(d / "big.bin", "wb", buffering=0) as f:
        for _ in range(200):
            f.write(b"x" * 4096)
    after = requests(mount, "getxattr"), status(mount)["passthrough"]["capability_answers"]
    assert opens(mount) >= 1
    assert after[0] - before[0] <= 1  # (the create's first write may still ask Python)
    assert after[1] - before[1] >= 199
    assert (d / "big.bin").stat().st_size == 200 * 4096


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_passed_through_files_capability_goes_at_its_next_write(mount: Mount) -> None:
    """Answered in C, the question still finds each file's own capability: one set while
    the file is open, and one of a file removed while open, go at the next write; a file
    without one, open beside them, is asked about itself, not about them."""
    d = mount.path / "node_modules"
    d.mkdir()
    tool, plain, gone = d / "tool", d / "plain", d / "gone"
    for p in (tool, plain, gone):
        p.write_bytes(b"#!/bin/sh\n")
    a = os.open(tool, os.O_WRONLY | os.O_APPEND)
    b = os.open(plain, os.O_WRONLY | os.O_APPEND)
    c = os.open(gone, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(a, b"a\n")
        os.write(b, b"b\n")
        os.write(c, b"c\n")
        os.setxattr(tool, "security.capability", CAP)
        os.setxattr(gone, "security.capability", CAP)
        os.unlink(gone)
        assert os.getxattr(tool, "security.capability") == CAP
        assert os.getxattr(c, "security.capability") == CAP
        os.write(b, b"b\n")  # (asks about plain only)
        assert os.getxattr(tool, "security.capability") == CAP
        os.write(a, b"a\n")
        os.write(c, b"c\n")
        for holder in (tool, c):
            with pytest.raises(OSError) as exc:
                os.getxattr(holder, "security.capability")
            assert exc.value.errno == errno.ENODATA
    finally:
        for fd in (a, b, c):
            os.close(fd)
    assert tool.read_bytes() == b"#!/bin/sh\na\na\n"
    assert plain.read_bytes() == b"#!/bin/sh\nb\nb\n"
    assert status(mount)["passthrough"]["capability_answers"] >= 3
    assert status(mount)["passthrough"]["files"] == 0


def _dir_view(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns)


def test_a_directorys_attributes_are_its_backing_directorys_through_every_change(
    mount: Mount,
) -> None:
    """GETATTR of a directory is answered in C (by file handle) once rwfs has answered for
    it in Python: after each change the mount's stat of every directory must be the backing
    directory's, and a directory removed or replaced must still be answered as before."""
    s = status(mount)
    backing = Path(f"/proc/{s['pid']}/fd/{s['root_fd']}")
    top = mount.path
    names = ["", "a", "a/b", "a/b/c", "node_modules", "node_modules/p"]

    def agree() -> None:
        for n in names:
            if (backing / n).exists():
                assert _dir_view((top / n).stat()) == _dir_view((backing / n).stat()), n
        assert top.stat().st_ino == 1  # FUSE's root, whatever the backing number
        for n in names[1:]:  # and the number its parent's listing gives it
            if (backing / n).exists():
                parent, _, name = n.rpartition("/")
                listed = {e.name: e.inode() for e in os.scandir(top / parent)}
                assert listed[name] == (top / n).stat().st_ino, n

    (top / "a/b/c").mkdir(parents=True)
    (top / "node_modules/p").mkdir(parents=True)
    agree()
    before = s["dir_attr_answers"]
    for i in range(20):  # entries made and removed: the kernel asks again each time
        (top / "a/b" / f"f{i}").write_bytes(b"x")
        (top / "node_modules/p" / f"g{i}").write_bytes(b"y")
        agree()
    for i in range(0, 20, 2):
        (top / "a/b" / f"f{i}").unlink()
        agree()
    os.chmod(top / "a/b", 0o711)
    os.chown(top / "a/b/c", 1234, 5678)
    os.utime(top / "a", ns=(1_000_000_000, 2_000_000_000))
    agree()
    assert (top / "a").stat().st_mtime_ns == 2_000_000_000
    os.rename(top / "a/b/c", top / "a/c2")
    names[3] = "a/c2"
    agree()
    assert status(mount)["dir_attr_answers"] > before  # (the C path answered)

    # Removed while open, and replaced by a rename over it: Python answers as before.
    held = os.open(top / "a/c2", os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen = os.fstat(held)
        os.rmdir(top / "a/c2")
        after = os.fstat(held)
        assert stat.S_ISDIR(after.st_mode) and after.st_ino == seen.st_ino
    finally:
        os.close(held)
    (top / "old").mkdir()
    (top / "new").mkdir(mode=0o700)
    held = os.open(top / "old", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(top / "new", top / "old")
        assert stat.S_IMODE((top / "old").stat().st_mode) == 0o700
        assert os.fstat(held).st_ino != (top / "old").stat().st_ino
    finally:
        os.close(held)
    names.append("old")
    agree()


def test_directories_are_answered_in_python_with_the_fast_path_off(workspace: Path) -> None:
    m = Mount(workspace, options=("fastpath=off",)).start()
    try:
        (m.path / "d/e").mkdir(parents=True)
        for i in range(10):
            (m.path / "d/e" / f"f{i}").write_bytes(b"x")
            (m.path / "d/e").stat()
        assert status(m)["dir_attr_answers"] == 0
    finally:
        m.stop()
    check_clean(m)


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_passed_through_files_attributes_change_as_a_plain_files(
    mount: Mount, tmp_path: Path
) -> None:
    """What tar, npm and pip do to each file they unpack, through the descriptor they wrote
    it with (times, owner, mode), is answered in C for a passed-through file: the same
    attributes as a plain file's after the same calls, the backing file's too; a size
    change still goes to Python."""
    s = status(mount)
    backing = Path(f"/proc/{s['pid']}/fd/{s['root_fd']}")
    (mount.path / "node_modules").mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()

    def run(top: Path) -> list[tuple[int, ...]]:
        seen = []
        fd = os.open(top / "f.js", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"module.exports = 1;\n")
            os.utime(fd, ns=(1_500_000_000_000_000_000, 1_600_000_000_000_000_000))
            os.fchown(fd, 1234, 5678)
            os.fchmod(fd, 0o4755)  # after the chown, which would clear it
            seen.append(os.fstat(fd))
            os.fchown(fd, 4321, -1)  # a chown clears set-user-ID
            os.utime(fd, ns=(1_700_000_000_000_000_000, 1_600_000_000_000_000_000))
            seen.append(os.fstat(fd))
            os.ftruncate(fd, 7)
            seen.append(os.fstat(fd))
            os.unlink(top / "f.js")
            os.fchmod(fd, 0o640)
            seen.append(os.fstat(fd))
        finally:
            os.close(fd)
        # (A truncation moves the mtime to now: only the times set are compared.)
        return [(st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink) for st in seen] + [
            (st.st_atime_ns, st.st_mtime_ns) for st in seen[:2]
        ]

    before = status(mount)["passthrough"]["attr_answers"], requests(mount, "setattr")
    got = run(mount.path / "node_modules")
    after = status(mount)["passthrough"]["attr_answers"], requests(mount, "setattr")
    assert got == run(plain)
    assert after[0] - before[0] >= 5  # (answered in C)
    assert after[1] - before[1] <= 2  # the size change, the chmod of the removed file
    g = mount.path / "node_modules" / "g"
    fd = os.open(g, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.fchmod(fd, 0o700)
        os.utime(fd, ns=(1, 2))
        assert _dir_view(os.stat(backing / "node_modules" / "g"))[:1] == (stat.S_IFREG | 0o700,)
        assert os.stat(backing / "node_modules" / "g").st_mtime_ns == 2
    finally:
        os.close(fd)
    assert status(mount)["passthrough"]["files"] == 0


@pytest.mark.skipif(not PASSES, reason="needs FUSE passthrough (Linux 6.9, CAP_SYS_ADMIN)")
def test_a_removed_passed_through_file_is_cut_and_grown_in_place(mount: Mount) -> None:
    """The kernel goes on reading and writing a passed-through file that was removed while
    open on its backing file: a truncation or an fallocate of it must change that file, not
    a stage that its reads never see (the model test found the sizes disagreeing)."""
    d = mount.path / "node_modules"
    d.mkdir()
    (d / "a").write_bytes(b"old bytes\n")
    fd = os.open(d / "a", os.O_RDWR)
    try:
        assert opens(mount) >= 1
        os.unlink(d / "a")
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"\x00", 0)
        st = os.fstat(fd)
        assert (os.pread(fd, 100, 0), st.st_size, st.st_nlink) == (b"\x00", 1, 0)
        os.posix_fallocate(fd, 0, 4096)
        os.pwrite(fd, b"x", 10)
        st = os.fstat(fd)
        assert st.st_size == 4096
        assert os.pread(fd, 8192, 0) == b"\x00" * 10 + b"x" + b"\x00" * 4085
        os.ftruncate(fd, 11)
        assert (os.fstat(fd).st_size, os.pread(fd, 100, 0)) == (11, b"\x00" * 10 + b"x")
    finally:
        os.close(fd)
    assert status(mount)["passthrough"]["files"] == 0
