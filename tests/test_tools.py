"""Real tools working unchanged inside an rwfs mount (SPEC §9, transparency).

Each test runs an ordinary tool (git, tar, rsync, cp, sed, sqlite3, python -m venv and pip,
mmap) against ``mount.path`` and asserts a concrete result; the ``mount`` fixture unmounts,
checks the daemon logged no traceback and that ``rwfs fsck`` agrees with the tree.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import Mount


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def make_tree(root: Path) -> None:
    """A small tree: nested dirs, binary and empty files, odd modes, a symlink."""
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"alpha\n" * 100)
    (root / "empty").write_bytes(b"")
    (root / "sub" / "bin.dat").write_bytes(bytes(range(256)) * 40)
    (root / "sub" / "deeper" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "sub" / "deeper" / "run.sh").chmod(0o755)
    (root / "secret").write_bytes(b"s3cr3t\n")
    (root / "secret").chmod(0o600)
    (root / "odd").write_bytes(b"odd mode\n")
    (root / "odd").chmod(0o741)
    (root / "sub" / "deeper").chmod(0o750)
    (root / "link").symlink_to("sub/bin.dat")
    (root / "dangling").symlink_to("nowhere/at/all")
    # Old, distinct times (deepest first), so a tool that loses them is caught.
    for n, (dirpath, dirnames, filenames) in enumerate(os.walk(root, topdown=False)):
        for k, name in enumerate([*filenames, *dirnames]):
            t = 1_000_000_000 + 1000 * n + k
            os.utime(Path(dirpath) / name, (t, t), follow_symlinks=False)
    os.utime(root, (999_999_000, 999_999_000))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: type, mode, and bytes or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            key = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[key] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[key] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[key] = ("file", stat.S_IMODE(st.st_mode), p.read_bytes())
    return out


def mtimes(root: Path) -> dict[str, int]:
    """The mtime of every entry below ``root`` and of ``root`` itself (seconds)."""
    out = {".": int(root.stat().st_mtime)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = int(p.lstat().st_mtime)
    return out


# ---- git ----


def test_git_init_commit_branch_checkout(mount: Mount, tmp_path: Path) -> None:
    repo = mount.path / "repo"
    repo.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Ann Author",
        "GIT_AUTHOR_EMAIL": "ann@example.com",
        "GIT_COMMITTER_NAME": "Cid Committer",
        "GIT_COMMITTER_EMAIL": "cid@example.com",
    }

    def git(*args: str) -> str:
        return run("git", "-c", "init.defaultBranch=main", *args, cwd=repo, env=env)

    git("init", "-q")
    (repo / "README").write_bytes(b"main readme\n")
    (repo / "src").mkdir()
    (repo / "src" / "lib.py").write_bytes(b"X = 1\n")
    (repo / "tool.sh").write_bytes(b"#!/bin/sh\necho tool\n")
    (repo / "tool.sh").chmod(0o755)
    git("add", "-A")
    git("commit", "-q", "-m", "first on main")

    git("checkout", "-q", "-b", "feature")
    (repo / "README").write_bytes(b"feature readme, longer than before\n")
    (repo / "src" / "lib.py").unlink()
    (repo / "src" / "new.py").write_bytes(b"Y = 2\n")
    git("add", "-A")
    git("commit", "-q", "-m", "second on feature")
    assert git("status", "--porcelain") == ""

    git("checkout", "-q", "main")
    assert (repo / "README").read_bytes() == b"main readme\n"
    assert (repo / "src" / "lib.py").read_bytes() == b"X = 1\n"
    assert not (repo / "src" / "new.py").exists()
    assert stat.S_IMODE((repo / "tool.sh").stat().st_mode) == 0o755
    assert git("status", "--porcelain") == ""
    assert git("log", "--format=%s %an").splitlines() == ["first on main Ann Author"]

    git("checkout", "-q", "feature")
    assert (repo / "README").read_bytes() == b"feature readme, longer than before\n"
    assert (repo / "src" / "new.py").read_bytes() == b"Y = 2\n"
    assert not (repo / "src" / "lib.py").exists()
    assert git("status", "--porcelain") == ""
    assert git("log", "--format=%s").splitlines() == ["second on feature", "first on main"]

    # Rebase feature onto a new commit on main: the work tree is rewritten again.
    git("checkout", "-q", "main")
    (repo / "tool.sh").write_bytes(b"#!/bin/sh\necho tool v2\n")
    git("commit", "-q", "-am", "tool v2 on main")
    git("checkout", "-q", "feature")
    git("rebase", "-q", "main")
    assert (repo / "tool.sh").read_bytes() == b"#!/bin/sh\necho tool v2\n"
    assert (repo / "README").read_bytes() == b"feature readme, longer than before\n"
    assert git("log", "--format=%s").splitlines() == [
        "second on feature",
        "tool v2 on main",
        "first on main",
    ]
    assert git("status", "--porcelain") == ""

    git("gc", "-q")
    git("fsck", "--strict")
    assert git("status", "--porcelain") == ""

    # A clone inside the mount checks out the same tree.
    run("git", "clone", "-q", "-b", "feature", repo, mount.path / "clone", env=env)
    clone = mount.path / "clone"
    for name in ("README", "tool.sh", "src/new.py"):
        assert (clone / name).read_bytes() == (repo / name).read_bytes()
    assert stat.S_IMODE((clone / "tool.sh").stat().st_mode) == 0o755
    assert run("git", "status", "--porcelain", cwd=clone, env=env) == ""

    # The work tree is journaled (checkout rewrote README), .git is passthrough.
    events = journal(mount)
    assert any(e["path"] == "repo/README" for e in events)
    assert not any(e["path"].startswith("repo/.git/") for e in events)


# ---- tar ----


def test_tar_extract_into_mount_and_create_from_it(mount: Mount, tmp_path: Path) -> None:
    src = tmp_path / "tsrc"
    make_tree(src)
    tarball = tmp_path / "in.tar"
    run("tar", "-C", src, "-cf", tarball, ".")

    dst = mount.path / "untarred"
    dst.mkdir()
    run("tar", "-C", dst, "-xpf", tarball)
    assert snapshot(dst) == snapshot(src)
    journal(mount)  # every queued commit is in the tree: no late rename touches a dir
    assert mtimes(dst) == mtimes(src)

    out = tmp_path / "out.tar"
    run("tar", "-C", mount.path, "-cf", out, "untarred")
    names = {n.rstrip("/") for n in run("tar", "-tf", out).splitlines()}
    assert names == {"untarred"} | {f"untarred/{k}" for k in snapshot(src)}

    back = tmp_path / "back"
    back.mkdir()
    run("tar", "-C", back, "-xpf", out)
    assert snapshot(back / "untarred") == snapshot(src)


# ---- rsync ----


def rsync_tree(root: Path) -> None:
    root.mkdir()
    (root / "dir").mkdir(mode=0o750)
    (root / "dir").chmod(0o750)
    (root / "dir" / "data.bin").write_bytes(os.urandom(50_000))
    (root / "hard1").write_bytes(b"one inode, two names\n")
    os.link(root / "hard1", root / "dir" / "hard2")
    (root / "sym").symlink_to("dir/data.bin")
    (root / "tagged").write_bytes(b"has an xattr\n")
    os.setxattr(root / "tagged", "user.test", b"value-\x00\xff")
    (root / "odd").write_bytes(b"odd\n")
    (root / "odd").chmod(0o2741)


def check_rsync_tree(root: Path) -> None:
    a, b = (root / "hard1").stat(), (root / "dir" / "hard2").stat()
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert (root / "dir" / "hard2").read_bytes() == b"one inode, two names\n"
    assert os.readlink(root / "sym") == "dir/data.bin"
    assert os.getxattr(root / "tagged", "user.test") == b"value-\x00\xff"
    assert stat.S_IMODE((root / "odd").stat().st_mode) == 0o2741
    assert stat.S_IMODE((root / "dir").stat().st_mode) == 0o750


def test_rsync_ahax_round_trip(mount: Mount, tmp_path: Path) -> None:
    src = tmp_path / "rsrc"
    rsync_tree(src)
    dst = mount.path / "dst"
    run("rsync", "-aHAX", f"{src}/", f"{dst}/")
    check_rsync_tree(dst)
    assert snapshot(dst) == snapshot(src)
    assert run("rsync", "-anciHAX", "--delete", f"{src}/", f"{dst}/") == ""

    back = tmp_path / "back"
    run("rsync", "-aHAX", f"{dst}/", f"{back}/")
    check_rsync_tree(back)
    assert snapshot(back) == snapshot(src)
    assert run("rsync", "-anciHAX", "--delete", f"{dst}/", f"{back}/") == ""
    assert run("rsync", "-anciHAX", "--delete", f"{dst}/", f"{src}/") == ""

    # A change at the source is seen, sent, and then nothing is left to do.
    (src / "dir" / "data.bin").write_bytes(b"changed\n")
    assert "dir/data.bin" in run("rsync", "-anciHAX", "--delete", f"{src}/", f"{dst}/")
    run("rsync", "-aHAX", "--delete", f"{src}/", f"{dst}/")
    assert (dst / "dir" / "data.bin").read_bytes() == b"changed\n"
    assert run("rsync", "-anciHAX", "--delete", f"{src}/", f"{dst}/") == ""


# ---- cp ----


def test_cp_a_into_mount(mount: Mount, tmp_path: Path) -> None:
    src = tmp_path / "csrc"
    make_tree(src)
    run("cp", "-a", src, mount.path / "copy")
    dst = mount.path / "copy"
    assert snapshot(dst) == snapshot(src)
    journal(mount)  # every queued commit is in the tree: no late rename touches a dir
    assert mtimes(dst) == mtimes(src)
    for rel_name in ("a.txt", "sub/bin.dat", "odd"):
        assert (dst / rel_name).stat().st_mtime_ns == (src / rel_name).stat().st_mtime_ns
    # And back out again, byte for byte.
    run("cp", "-a", dst, tmp_path / "again")
    assert snapshot(tmp_path / "again") == snapshot(src)


# ---- sed -i and write-temp-then-rename ----


def test_sed_in_place_is_a_rename_over_the_file(mount: Mount) -> None:
    f = mount.path / "conf" / "settings.ini"
    f.parent.mkdir()
    f.write_bytes(b"[main]\nname = world\nmode = 0\n")
    f.chmod(0o640)
    run("sed", "-i", "s/world/rwfs/; s/mode = 0/mode = 1/", f)
    assert f.read_bytes() == b"[main]\nname = rwfs\nmode = 1\n"
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert sorted(os.listdir(f.parent)) == ["settings.ini"]  # sed's temp file is gone
    renames = [e for e in journal(mount) if e["op"] == "rename"]
    assert any(e["dest"] == "conf/settings.ini" for e in renames), renames


def test_write_temp_fsync_replace(mount: Mount) -> None:
    target = mount.path / "state.json"
    target.write_bytes(b'{"v": 1}\n')
    tmp = mount.path / "state.json.tmp"
    with open(tmp, "wb") as fobj:
        fobj.write(b'{"v": 2, "pad": "' + b"x" * 10_000 + b'"}\n')
        fobj.flush()
        os.fsync(fobj.fileno())
    os.replace(tmp, target)
    want = b'{"v": 2, "pad": "' + b"x" * 10_000 + b'"}\n'
    assert target.read_bytes() == want
    assert not tmp.exists()
    # A fresh descriptor (no page cache shortcut) agrees.
    fd = os.open(target, os.O_RDONLY)
    try:
        assert os.pread(fd, len(want) + 10, 0) == want
    finally:
        os.close(fd)
    events = journal(mount)
    assert any(
        e["op"] == "rename" and e["path"] == "state.json.tmp" and e["dest"] == "state.json"
        for e in events
    )


# ---- sqlite (passthrough) ----


def test_sqlite_on_passthrough_db(mount: Mount) -> None:
    db = mount.path / "data" / "app.db"
    db.parent.mkdir()
    script = textwrap.dedent(
        """\
        CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
        BEGIN;
        INSERT INTO t (name) VALUES ('one');
        INSERT INTO t (name) VALUES ('two');
        INSERT INTO t (name) SELECT name || '!' FROM t;
        COMMIT;
        """
    )
    run("sqlite3", db, script)
    rows = run("sqlite3", db, "SELECT id, name FROM t ORDER BY id;").splitlines()
    assert rows == ["1|one", "2|two", "3|one!", "4|two!"]
    # The same file through Python's sqlite3, with a rolled-back transaction.
    import sqlite3

    con = sqlite3.connect(db)
    try:
        with con:
            con.execute("INSERT INTO t (name) VALUES ('three')")
        try:
            with con:
                con.execute("INSERT INTO t (name) VALUES ('never')")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        assert [r[0] for r in con.execute("SELECT name FROM t ORDER BY id")] == [
            "one",
            "two",
            "one!",
            "two!",
            "three",
        ]
    finally:
        con.close()
    assert run("sqlite3", db, "PRAGMA integrity_check;").strip() == "ok"
    events = journal(mount)
    assert not [e for e in events if e["path"].startswith("data/app.db")]
    assert any(e["op"] == "mkdir" and e["path"] == "data" for e in events)


# ---- python -m venv and pip ----


# A PEP 517 build backend kept in the package itself (``backend-path``): pip builds and
# installs it with no index and no build isolation. setuptools is not used because an
# offline fresh venv cannot build wheels with it: Python 3.11's bundled setuptools 65.5
# needs the separate ``wheel`` package for ``bdist_wheel``, and 3.12+ venvs have no
# setuptools at all.
BACKEND = """\
import base64, hashlib, os, pathlib, zipfile

DIST = "hello_rwfs-0.3.1"
SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
META = "Metadata-Version: 2.1\\nName: hello-rwfs\\nVersion: 0.3.1\\n"
WHEEL = "Wheel-Version: 1.0\\nGenerator: rwfs-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"


def _wheel(directory, files):
    files = files + [
        (DIST + ".dist-info/METADATA", META.encode()),
        (DIST + ".dist-info/WHEEL", WHEEL.encode()),
    ]
    name = DIST + "-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = hashlib.sha256(data).digest()
            b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            record.append(f"{arc},sha256={b64},{len(data)}")
        record.append(DIST + ".dist-info/RECORD,,")
        z.writestr(DIST + ".dist-info/RECORD", "\\n".join(record) + "\\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = [(p.relative_to(SRC).as_posix(), p.read_bytes()) for p in sorted(SRC.rglob("*.py"))]
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [("hello_rwfs_editable.pth", (str(SRC) + "\\n").encode())])
"""


def test_venv_and_pip_install_local_package(mount: Mount) -> None:
    venv = mount.path / ".venv"
    run(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    assert py.is_symlink() and (venv / "pyvenv.cfg").is_file()
    env = {
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INDEX": "1",
    }
    pkg = mount.path / "hello_pkg"
    (pkg / "src" / "hello_rwfs").mkdir(parents=True)
    (pkg / "_backend").mkdir()
    (pkg / "_backend" / "tiny_backend.py").write_text(BACKEND)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "tiny_backend"
            backend-path = ["_backend"]

            [project]
            name = "hello-rwfs"
            version = "0.3.1"
            """
        )
    )
    init = pkg / "src" / "hello_rwfs" / "__init__.py"
    init.write_text('def greet() -> str:\n    return "hello from inside the mount"\n')
    probe = (
        "import hello_rwfs, importlib.metadata as m;"
        "print(hello_rwfs.greet(), m.version('hello-rwfs'), hello_rwfs.__file__, sep='|')"
    )
    pip = (py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation")

    # A plain install copies the package into the venv.
    run(*pip, pkg, env=env)
    greeting, version, where = run(py, "-c", probe, cwd=mount.path).strip().split("|")
    assert greeting == "hello from inside the mount"
    assert version == "0.3.1"
    assert where.startswith(str(venv / "lib"))
    assert (Path(where).read_bytes()) == init.read_bytes()

    # An editable install imports straight from the (journaled) source in the mount.
    run(*pip, "-e", pkg, env=env)
    init.write_text('def greet() -> str:\n    return "edited in place"\n')
    greeting, version, where = run(py, "-c", probe, cwd=mount.path).strip().split("|")
    assert greeting == "edited in place"
    assert where == str(init)
    assert "hello-rwfs" in run(py, "-m", "pip", "list", "--format=freeze", env=env).replace(
        "_", "-"
    )

    # The venv is passthrough, never journaled; the package source is.
    events = journal(mount)
    assert not [e for e in events if e["path"].startswith(".venv/")]
    assert any(
        e["op"] == "write" and e["path"] == "hello_pkg/src/hello_rwfs/__init__.py" for e in events
    )


# ---- mmap ----


def test_mmap_write_on_journaled_file(mount: Mount) -> None:
    f = mount.path / "mapped.bin"
    old = bytes(range(256)) * 32  # 8 KiB, two pages
    f.write_bytes(old)
    patch = b"MMAP WRITE ACROSS A PAGE BOUNDARY"
    at = 4096 - 10
    with open(f, "r+b") as fobj:
        with mmap.mmap(fobj.fileno(), 0) as mm:
            mm[at : at + len(patch)] = patch
            mm[0:4] = b"HEAD"
            mm.flush()
        os.fsync(fobj.fileno())
    want = bytearray(old)
    want[at : at + len(patch)] = patch
    want[0:4] = b"HEAD"
    assert f.read_bytes() == bytes(want)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert os.pread(fd, len(want), 0) == bytes(want)
    finally:
        os.close(fd)
    writes = [e for e in journal(mount) if e["op"] == "write" and e["path"] == "mapped.bin"]
    assert writes[-1]["intended"] == sha(bytes(want))
    assert writes[-1]["expected"] == sha(old)

    # No msync, no fsync: the dirty pages are written back when the file is closed.
    with open(f, "r+b") as fobj:
        with mmap.mmap(fobj.fileno(), 0) as mm:
            mm[-4:] = b"TAIL"
    want[-4:] = b"TAIL"
    fd = os.open(f, os.O_RDONLY)
    try:
        assert os.pread(fd, len(want) + 1, 0) == bytes(want)
    finally:
        os.close(fd)
    writes = [e for e in journal(mount) if e["op"] == "write" and e["path"] == "mapped.bin"]
    assert writes[-1]["intended"] == sha(bytes(want))
