"""Control files tell the truth (SPEC §5, §7.2, §8) through real mounts: every file under
``.rw/`` reports its real size and a meaningful mtime, so any copying tool gets its bytes;
restore and undo bring modes back and refuse bad requests; rwfs refuses to nest."""

from __future__ import annotations

import calendar
import errno
import filecmp
import json
import mmap
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import RWFS, Mount, rwfs_mounted


def _ctl(m: Mount, text: str) -> None:
    (m.path / ".rw" / "ctl").write_text(text + "\n")


def _envelope(m: Mount) -> dict[str, object]:
    return dict(json.loads((m.path / ".rw" / "last-error").read_text()))


def rwfs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RWFS, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``root`` (``.rw`` aside): its bytes and mode bits."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] == ".rw" or not p.is_file():
            continue
        out[str(rel)] = (p.read_bytes(), p.stat().st_mode & 0o7777)
    return out


def _assert_true_size(p: Path) -> bytes:
    """The file's bytes, after checking that stat, fstat and every way of copying it agree
    with them."""
    with open(p, "rb") as f:
        data = f.read()
        assert os.fstat(f.fileno()).st_size == len(data), p
    assert data, f"{p} read empty: the test needs bytes"
    return data


def _copies_agree(p: Path, data: bytes, out: Path) -> None:
    """shutil.copy, rsync, tar and a private mmap all give ``data``."""
    out.mkdir(parents=True, exist_ok=True)
    assert Path(shutil.copy(p, out / "shutil")).read_bytes() == data
    subprocess.run(["rsync", str(p), str(out / "rsync")], check=True, timeout=60)
    assert (out / "rsync").read_bytes() == data
    subprocess.run(
        ["tar", "-cf", str(out / "t.tar"), "-C", str(p.parent), p.name], check=True, timeout=60
    )
    with tarfile.open(out / "t.tar") as t:
        member = t.extractfile(p.name)
        assert member is not None and member.read() == data
    with open(p, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
            assert m[:] == data
        # A shared mapping of a file read with direct_io: the kernel refuses it, clearly
        # (a kernel and libfuse that allow it must map the real bytes).
        try:
            shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as err:
            assert err.errno == errno.ENODEV
        else:
            with shared:
                assert shared[:] == data


def _version_time(name: str) -> float:
    """The time in a history version's name (``000042-2026-11-30T10:12:03Z-3fa9c1d2``)."""
    stamp = name.split("-", 1)[1][:19]
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_history_versions_copy_with_every_tool(mount: Mount, tmp_path: Path) -> None:
    f = mount.path / "notes.txt"
    texts = [b"".join(b"line %d of version %d\n" % (i, v) for i in range(300)) for v in (1, 2)]
    f.write_bytes(texts[0])
    _ctl(mount, "sync")
    f.write_bytes(texts[1])
    f.unlink()  # a deleted file: its history is how to get it back
    top = mount.path / ".rw" / "history" / "notes.txt"
    names = sorted(p.name for p in top.iterdir())[-2:]  # (the first: the empty new file)
    for n, name in enumerate(names):
        data = _assert_true_size(top / name)
        assert data == texts[n]
        st = (top / name).stat()
        assert st.st_size == len(data)
        # The version's own time, not the mount's: the time in its name, to the second.
        assert int(st.st_mtime) == _version_time(name)
        _copies_agree(top / name, data, tmp_path / f"v{n}")
    # Restoring a deleted file with Python, as an agent would, gives the file back.
    shutil.copy(top / names[-1], f)
    assert f.read_bytes() == texts[1]
    res = subprocess.run(
        ["git", "diff", "--no-index", "--exit-code", str(top / names[-1]), str(f)],
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout


def test_snapshot_tree_copies_with_copytree_rsync_and_tar(mount: Mount, tmp_path: Path) -> None:
    (mount.path / "src").mkdir()
    (mount.path / "src" / "app.py").write_text("".join(f"x{i} = {i}\n" for i in range(200)))
    (mount.path / "src" / "kept.txt").write_text("never changed after the snapshot\n")
    (mount.path / "README").write_text("hello\n")
    want = _tree(mount.path)
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    (mount.path / "src" / "app.py").write_text("x = 'changed after'\n")  # read from an object
    (mount.path / "README").unlink()
    tree = mount.path / ".rw" / "snapshots" / "s" / "tree"
    for rel in want:
        data = _assert_true_size(tree / rel)
        assert data == want[rel][0]
        assert (tree / rel).stat().st_size == len(data)
    shutil.copytree(tree, tmp_path / "copytree")
    assert {k: v[0] for k, v in _tree(tmp_path / "copytree").items()} == {
        k: v[0] for k, v in want.items()
    }
    subprocess.run(["rsync", "-a", f"{tree}/", str(tmp_path / "rsync")], check=True, timeout=60)
    assert {k: v[0] for k, v in _tree(tmp_path / "rsync").items()} == {
        k: v[0] for k, v in want.items()
    }
    (tmp_path / "untar").mkdir()
    subprocess.run(["tar", "-cf", str(tmp_path / "s.tar"), "-C", str(tree), "."], check=True)
    subprocess.run(
        ["tar", "-xf", str(tmp_path / "s.tar"), "-C", str(tmp_path / "untar")], check=True
    )
    assert {k: v[0] for k, v in _tree(tmp_path / "untar").items()} == {
        k: v[0] for k, v in want.items()
    }
    _copies_agree(tree / "src" / "app.py", want["src/app.py"][0], tmp_path / "one")
    assert filecmp.cmp(tree / "src" / "kept.txt", mount.path / "src" / "kept.txt", shallow=False)


def test_refused_draft_status_and_journal_report_their_sizes(mount: Mount, tmp_path: Path) -> None:
    good = "".join(f"def f{i}():\n    return {i}\n" for i in range(30))
    (mount.path / "m.py").write_text(good)
    bad = good.replace("f5():", "f5(:")
    before = time.time()
    with pytest.raises(OSError):
        (mount.path / "m.py").write_text(bad)
    (draft,) = list((mount.path / ".rw" / "rejected").iterdir())
    assert _assert_true_size(draft) == bad.encode()
    assert draft.stat().st_size == len(bad)
    assert draft.stat().st_mtime >= int(before)  # the time it was refused, not the mount's
    _copies_agree(draft, bad.encode(), tmp_path / "draft")
    _ctl(mount, "sync")
    for name in ("status", "journal", "last-error", "README", "stats", "policy.toml"):
        p = mount.path / ".rw" / name
        data = _assert_true_size(p)
        copied = Path(shutil.copy(p, tmp_path / name)).read_bytes()
        if name in ("journal", "last-error", "README", "policy.toml"):  # nothing changes them
            assert p.stat().st_size == len(data)
            assert copied == data
        else:  # figures that move with each request: a whole document each time
            assert json.loads(copied)
    lines = (tmp_path / "journal").read_text().splitlines()
    assert [json.loads(x)["op"] for x in lines][-1] == "refuse"
    subprocess.run(["rsync", str(mount.path / ".rw" / "status"), str(tmp_path / "st")], check=True)
    # tar checks that size and mtime stay put while it reads: they do.
    names = ["status", "journal", "README", "policy.toml"]
    subprocess.run(
        ["tar", "-cf", str(tmp_path / "rw.tar"), "-C", str(mount.path / ".rw"), *names], check=True
    )
    with tarfile.open(tmp_path / "rw.tar") as t:
        assert json.loads(t.extractfile("status").read())["pid"] == mount.proc.pid  # type: ignore[union-attr]
    assert json.loads((tmp_path / "st").read_text())["pid"] == mount.proc.pid  # type: ignore[union-attr]


def test_restore_brings_back_the_mode_of_each_file(mount: Mount) -> None:
    tool = mount.path / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    secret = mount.path / "secret.txt"
    secret.write_text("mine\n")
    secret.chmod(0o600)
    plain = mount.path / "plain.txt"
    plain.write_text("plain\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    tool.unlink()
    secret.write_text("changed\n")
    secret.chmod(0o644)
    plain.unlink()
    _ctl(mount, "restore s")
    assert tool.read_text() == "#!/bin/sh\necho hi\n"
    assert tool.stat().st_mode & 0o7777 == 0o755
    assert secret.read_text() == "mine\n"
    assert secret.stat().st_mode & 0o7777 == 0o600
    assert plain.stat().st_mode & 0o7777 == 0o644
    # The snapshot's tree shows the bytes; restoring them by hand keeps working too.
    assert subprocess.run([str(tool)], capture_output=True, text=True).stdout == "hi\n"


def test_undo_brings_back_the_mode_of_each_file(mount: Mount) -> None:
    tool = mount.path / "run.sh"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    key = mount.path / "key.txt"
    key.write_text("k\n")
    key.chmod(0o600)
    (mount.path / ".rw" / "batches" / "rm").mkdir()
    tool.unlink()
    key.unlink()
    (mount.path / ".rw" / "batches" / "rm" / "ctl").write_text("commit\n")
    assert not tool.exists() and not key.exists()
    _ctl(mount, "undo rm")
    assert tool.stat().st_mode & 0o7777 == 0o755
    assert key.stat().st_mode & 0o7777 == 0o600
    assert key.read_text() == "k\n"
    # A plain rm (a batch of one) too, of a file that existed before the mount.
    tool.unlink()
    _ctl(mount, "sync")
    events = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    gone = [e for e in events if e["op"] == "unlink" and e["path"] == "run.sh"][-1]
    _ctl(mount, f"undo {gone['batch']}")
    assert tool.stat().st_mode & 0o7777 == 0o755


def test_mode_of_a_file_that_predates_the_mount_comes_back(workspace: Path) -> None:
    (workspace / "old.sh").write_text("#!/bin/sh\n")
    (workspace / "old.sh").chmod(0o750)
    m = Mount(workspace).start()
    try:
        (m.path / ".rw" / "snapshots" / "s").mkdir()
        (m.path / "old.sh").unlink()
        _ctl(m, "restore s")
        assert (m.path / "old.sh").stat().st_mode & 0o7777 == 0o750
    finally:
        m.stop()


def test_undo_twice_is_refused_and_changes_nothing(mount: Mount) -> None:
    (mount.path / "a.txt").write_text("a0\n")
    (mount.path / "c.txt").write_text("c0\n")
    (mount.path / ".rw" / "batches" / "edit").mkdir()
    (mount.path / "a.txt").write_text("a1\n")
    (mount.path / "b.txt").write_text("b1\n")
    (mount.path / "c.txt").unlink()
    (mount.path / ".rw" / "batches" / "edit" / "ctl").write_text("commit\n")
    _ctl(mount, "undo edit")
    after_undo = _tree(mount.path)
    assert after_undo == {"a.txt": (b"a0\n", 0o644), "c.txt": (b"c0\n", 0o644)}
    _ctl(mount, "sync")
    journal = (mount.path / ".rw" / "journal").read_text()
    batches = sorted(p.name for p in (mount.path / ".rw" / "batches").iterdir())
    with pytest.raises(OSError) as err:
        _ctl(mount, "undo edit")
    assert err.value.errno == errno.EINVAL
    env = _envelope(mount)
    assert env["ok"] is False and env["error"] == "policy_violation"
    assert "undo-edit" in str(env["message"]) and env["path"] == ".rw/ctl"
    assert _tree(mount.path) == after_undo
    _ctl(mount, "sync")
    assert (mount.path / ".rw" / "journal").read_text() == journal
    assert sorted(p.name for p in (mount.path / ".rw" / "batches").iterdir()) == batches
    res = rwfs("undo", "edit", cwd=mount.path)
    assert res.returncode == 1 and "undo-edit" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert _tree(mount.path) == after_undo
    # Undoing the undo redoes the batch; then the batch can be undone again.
    _ctl(mount, "undo undo-edit")
    assert (mount.path / "a.txt").read_text() == "a1\n" and not (mount.path / "c.txt").exists()
    res = rwfs("undo", "edit", cwd=mount.path)
    assert res.returncode == 0, res.stderr
    assert "undo-edit-2" in res.stdout, res.stdout  # the name of the batch it made
    assert (mount.path / ".rw" / "batches" / "undo-edit-2").is_dir()
    assert _tree(mount.path) == after_undo


def test_restore_refuses_paths_outside_the_workspace(mount: Mount, tmp_path: Path) -> None:
    (mount.path / "etc").mkdir()
    (mount.path / "etc" / "passwd").write_text("in the workspace\n")
    (mount.path / "a.txt").write_text("a0\n")
    (tmp_path / "outside").write_text("outside\n")
    (mount.path / ".rw" / "snapshots" / "s").mkdir()
    (mount.path / "etc" / "passwd").write_text("changed\n")
    (mount.path / "a.txt").write_text("a1\n")
    before = _tree(mount.path)
    for bad in ("../outside", "/etc/passwd", str(tmp_path / "outside"), "etc/../a.txt", ".."):
        with pytest.raises(OSError) as err:
            _ctl(mount, f"restore s {bad}")
        assert err.value.errno == errno.EINVAL, bad
        env = _envelope(mount)
        assert env["error"] == "policy_violation" and "outside" in str(env["message"]), env
        assert _tree(mount.path) == before
        assert (tmp_path / "outside").read_text() == "outside\n"
    for bad in ("../outside", "/etc/passwd"):
        res = rwfs("restore", "s", bad, cwd=mount.path)
        assert res.returncode == 1, res.stdout + res.stderr
        assert _tree(mount.path) == before
    assert not (mount.path / ".rw" / "batches" / "restore-s").exists()
    _ctl(mount, "restore s etc/passwd")  # a path inside the workspace is restored
    assert (mount.path / "etc" / "passwd").read_text() == "in the workspace\n"
    assert (mount.path / "a.txt").read_text() == "a1\n"
    res = rwfs("restore", "s", ".", cwd=mount.path)  # the top: everything
    assert res.returncode == 0 and "(batch restore-s-2:" in res.stdout, res.stdout + res.stderr
    assert (mount.path / "a.txt").read_text() == "a0\n"


def _refused_nested(ws: Path, mountpoint: Path | None) -> None:
    args = ["mount", str(ws)] + ([str(mountpoint)] if mountpoint else [])
    point = mountpoint or ws
    try:
        res = rwfs(*args)
    finally:  # (were it mounted, never leave it so)
        if rwfs_mounted(str(point)):
            subprocess.run(["fusermount3", "-u", str(point)], timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "inside an rwfs mount" in lines[0], res.stderr
    assert not rwfs_mounted(str(point))
    assert not (ws / ".rw").exists()


def test_a_workspace_inside_a_mount_is_refused(mount: Mount) -> None:
    inner = mount.path / "inner"
    inner.mkdir()
    (inner / "f.txt").write_text("f\n")
    _refused_nested(inner, None)
    _ctl(mount, "sync")
    events = [json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
    assert not [e for e in events if e["path"].startswith("inner/.rw")]


def test_a_mount_point_inside_a_mount_is_refused(mount: Mount, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (mount.path / "mnt").mkdir()
    _refused_nested(other, mount.path / "mnt")
    # Through a symlink to the mount, too.
    (tmp_path / "link").symlink_to(mount.path / "mnt")
    _refused_nested(other, tmp_path / "link")
    _refused_nested(tmp_path / "link", None)


def test_modes_at_follows_the_journal() -> None:
    from rwfs.core.changes import modes_at

    evs = [
        {"op": "create", "path": "a.sh", "mode": 0o755},
        {"op": "write", "path": "a.sh", "expected": None, "mode": 0o755},
        {"op": "setattr", "path": "a.sh", "mode": 0o700},
        {"op": "write", "path": "d/k", "expected": None, "mode": 0o600},
        {"op": "rename", "path": "d", "dest": "e"},  # a directory: its files move
        {"op": "rename", "path": "a.sh", "dest": "b.sh", "intended": "sha256:x"},
        {"op": "write", "path": "c", "expected": None, "mode": 0o644},
        {"op": "rename", "path": "c", "dest": "e/k", "exchange": True},
        # after the point: a file that predates rwfs, removed; a chmod of b.sh
        {"op": "unlink", "path": "old", "mode": 0o750, "batch": "rm"},
        {"op": "setattr", "path": "b.sh", "mode": 0o644},
        {"op": "write", "path": "new", "expected": None, "mode": 0o640},
    ]
    for n, ev in enumerate(evs, 1):
        ev["lsn"] = n
    assert modes_at(evs, lsn=8) == {b"b.sh": 0o700, b"c": 0o600, b"e/k": 0o644, b"old": 0o750}
    assert modes_at(evs, batch="rm") == modes_at(evs, lsn=8)
    assert modes_at(evs, lsn=3) == {b"a.sh": 0o700, b"old": 0o750}


def test_an_append_to_a_control_file_appends(mount: Mount) -> None:
    """`>>` on policy.toml or a scratch file adds to what it holds, as on a file (it used to
    replace the text with NULs and the appended line: "not valid TOML at line 1")."""
    policy = mount.path / ".rw" / "policy.toml"
    before = policy.read_text()
    res = subprocess.run(["sh", "-c", f"echo '# a note' >> {policy}"], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert policy.read_text() == before + "# a note\n"
    note = mount.path / ".rw" / "scratch" / "n.txt"
    note.write_text("one\n")
    with open(note, "a") as f:
        f.write("two\n")
    assert note.read_text() == "one\ntwo\n"
    policy.write_text(before)
