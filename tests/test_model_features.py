"""A model test of the features on top of the commit path, through one real mount.

A hypothesis state machine interleaves the ways programs write a file (in place,
``O_TRUNC``, append, a temporary renamed over the target, real ``sed -i``, ``mv`` and
``cp`` of another file onto it, ``truncate``, ``rm``, ``ln`` of a hard link) on ordinary,
deep (a path past LMDB's 511-byte key limit) and odd-byte names, with snapshots,
``restore`` (of the run's directory or of one path), explicit batches (open, commit, abort)
and ``undo`` of the last committed batch, renames and exchanges of a directory while a
write through a hard link's other name is queued, and a remount (after which the mount
knows no name it has not looked up again; ``rwfs fsck`` must agree then too). A plain dictionary is the model, with the groups
of names that are one file (hard links): a write in place changes every name of the group,
a save by rename or a removal takes the name out of it. In an open batch, ``mv`` of a
file the batch did not make is EXDEV, so it copies (into the target's file, in place, if
there is one) and removes the source, hard-linked names included. After every step it
checks:

- the files the mount shows, with their bytes;
- each snapshot's ``tree/``, against the model's copy taken when it was made;
- each path's ``history/``: every committed version is listed, the newest listed is the
  committed file, no two neighbours are equal, and no temporary name is listed.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import GATES_OFF, Mount, check_clean, prepare_state
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rwfs.core.syscalls import renameat2

LONG_DIR = "/".join(c * 200 for c in "LMN")  # with the run's directory: > 600 bytes
ODD = os.fsdecode(b"o\xff\xfe dd\nname.txt")
NAMES = ["a.py", "b.txt", "d/c.py", f"{LONG_DIR}/f.txt", ODD]
DIRS = ["d", "e", LONG_DIR]  # e: empty, for exchanges with d

names = st.sampled_from(NAMES)
data = st.binary(max_size=40) | st.sampled_from([b"a\nab\n", b"alpha\nbeta", b"x" * 3000])

Tree = dict[str, bytes]


class Run:
    """The mount one test run works in (set by the fixture), and what the runs did."""

    mount: Mount
    n = 0
    steps = 0  # steps of every run
    longest = 0  # steps of the longest run
    remounts = 0


def ctl(path: Path, text: str) -> None:
    with open(path, "wb") as f:
        f.write(os.fsencode(text) + b"\n")  # names of any bytes


def files(top: Path) -> Tree:
    out: Tree = {}
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, top)] = f.read()
    return out


def sed(body: bytes) -> bytes:
    """What ``sed -i s/a/A/`` makes of the bytes (the first ``a`` of every line)."""
    return b"\n".join(line.replace(b"a", b"A", 1) for line in body.split(b"\n"))


class Features(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Run.n += 1
        self.run = f"run{Run.n}"
        self.mp = Run.mount.path
        self.top = self.mp / self.run
        self.rw = self.mp / ".rw"
        for d in DIRS:
            (self.top / d).mkdir(parents=True)
        self.view: Tree = {}  # what the mount shows
        self.committed: Tree = {}  # what the tree holds (differs while a batch is open)
        self.saves: dict[str, list[bytes]] = {}  # every committed version of each path
        self.snaps: dict[str, Tree] = {}
        self.batch: str | None = None
        self.batch_base: Tree = {}
        self.batches = 0
        self.last: tuple[str, dict[str, tuple[bytes | None, bytes | None]]] | None = None
        self.steps = -1
        self.links: list[set[str]] = []  # names that are one file (the view's)
        self.links_base: list[set[str]] = []  # at the open batch's start
        self.linked_in_batch = False  # a batch's change touched a linked name
        # Names the open batch made (a file created, or a temporary renamed onto the
        # name): only such a file is renamed within the batch; rename() of any other is
        # EXDEV, and mv copies it instead.
        self.made: set[str] = set()
        self.remounted = False

    # ---- the model ----

    def set(self, name: str, body: bytes | None) -> None:
        if self.batch is not None and body is None:
            self.made.discard(name)
        elif self.batch is not None and name not in self.view:
            self.made.add(name)
        if body is None:
            self.view.pop(name, None)
        else:
            self.view[name] = body
        if self.batch is None:
            self.commit_model({name: body})

    def group(self, name: str) -> set[str]:
        """The names that are one file with ``name`` (``{name}`` if it has no link)."""
        return next((g for g in self.links if name in g), {name})

    def unlink_name(self, name: str) -> None:
        """``name`` stops naming its file (removed, or replaced by a rename)."""
        for g in self.links:
            g.discard(name)
        self.links = [g for g in self.links if len(g) > 1]

    def write(self, name: str, body: bytes) -> None:
        """A write in place: every name of the file shows it."""
        group = self.group(name)
        if self.batch is not None and len(group) > 1:
            self.linked_in_batch = True
        for n in group:
            self.set(n, body)

    def replace(self, name: str, body: bytes | None) -> None:
        """The name gets a new file (a save by rename), or none (a removal)."""
        if self.batch is not None and len(self.group(name)) > 1:
            self.linked_in_batch = True
        self.unlink_name(name)
        if self.batch is not None and body is not None:
            self.made.add(name)  # (a temporary the batch made, renamed onto the name)
        self.set(name, body)

    def commit_model(self, changes: dict[str, bytes | None]) -> None:
        for name, body in changes.items():
            if body is None:
                self.committed.pop(name, None)
                continue
            self.committed[name] = body
            got = self.saves.setdefault(name, [])
            if not got or got[-1] != body:
                got.append(body)

    def p(self, name: str) -> Path:
        return self.top / name

    # ---- ways to write ----

    @rule(name=names, buf=data)
    def write_in_place(self, name: str, buf: bytes) -> None:
        fd = os.open(self.p(name), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, buf, 0)
        finally:
            os.close(fd)
        old = self.view.get(name, b"")
        self.write(name, buf + old[len(buf) :])

    @rule(name=names, buf=data)
    def write_truncating(self, name: str, buf: bytes) -> None:
        self.p(name).write_bytes(buf)
        self.write(name, buf)

    @rule(name=names, buf=data)
    def append(self, name: str, buf: bytes) -> None:
        with open(self.p(name), "ab") as f:
            f.write(buf)
        self.write(name, self.view.get(name, b"") + buf)

    @rule(name=names, buf=data, style=st.sampled_from(["sedXXXXXX", ".rsync.XXXXXX", "~tmp"]))
    def save_by_rename(self, name: str, buf: bytes, style: str) -> None:
        """An editor's, an agent tool's or rsync's save: a temporary, then os.replace."""
        target = self.p(name)
        tmp = target.parent / (style.replace("XXXXXX", "Q7x9Zk") + target.name[:20])
        tmp.write_bytes(buf)
        os.replace(tmp, target)
        self.replace(name, buf)

    @precondition(lambda self: self.view)
    @rule(name=names)
    def sed_in_place(self, name: str) -> None:
        res = subprocess.run(
            ["sed", "-i", "s/a/A/", "--", self.p(name)],
            capture_output=True,
            env={**os.environ, "LC_ALL": "C"},
            timeout=60,
        )
        if name not in self.view:
            assert res.returncode != 0
            return
        assert res.returncode == 0, res.stderr
        self.replace(name, sed(self.view[name]))

    @rule(src=names, dst=names)
    def mv(self, src: str, dst: str) -> None:
        if src == dst:
            return
        if src not in self.view:
            with pytest.raises(FileNotFoundError):
                shutil.move(self.p(src), self.p(dst))
            return
        if dst in self.group(src):  # rename(2) of two names of one file does nothing
            os.rename(self.p(src), self.p(dst))
            return
        body = self.view[src]
        if self.batch is not None and src not in self.made:
            # rename() of a file the batch did not make is EXDEV: shutil.move copies it
            # (into dst's file, in place, if there is one), then removes src.
            shutil.move(self.p(src), self.p(dst))
            if dst in self.view:
                self.write(dst, body)
            else:
                self.set(dst, body)
            self.replace(src, None)
            return
        shutil.move(self.p(src), self.p(dst))
        group = set(self.group(src))  # (a copy: replace() changes the model's groups)
        self.replace(src, None)
        self.replace(dst, body)
        if len(group) > 1:  # the name moved: dst is one of the file's names now
            others = group - {src}
            self.links = [g for g in self.links if not g & others] + [others | {dst}]

    @rule(src=names, dst=names)
    def cp(self, src: str, dst: str) -> None:
        if src == dst or src not in self.view:
            return
        if dst in self.group(src):
            with pytest.raises(shutil.SameFileError):
                shutil.copyfile(self.p(src), self.p(dst))
            return
        shutil.copyfile(self.p(src), self.p(dst))
        self.write(dst, self.view[src])

    @rule(name=names, size=st.sampled_from([0, 1, 5, 100]))
    def truncate(self, name: str, size: int) -> None:
        if name not in self.view:
            with pytest.raises(FileNotFoundError):
                os.truncate(self.p(name), size)
            return
        os.truncate(self.p(name), size)
        old = self.view[name]
        self.write(name, old[:size] + b"\0" * (size - len(old)))

    @rule(name=names)
    def rm(self, name: str) -> None:
        if name not in self.view:
            with pytest.raises(FileNotFoundError):
                self.p(name).unlink()
            return
        self.p(name).unlink()
        self.replace(name, None)

    @precondition(lambda self: self.batch is None)
    @rule(src=names, dst=names)
    def link(self, src: str, dst: str) -> None:
        if src not in self.view or dst in self.view:
            with pytest.raises((FileNotFoundError, FileExistsError)):
                os.link(self.p(src), self.p(dst))
            return
        os.link(self.p(src), self.p(dst))
        group = self.group(src)
        self.links = [g for g in self.links if g is not group] + [group | {dst}]
        self.set(dst, self.view[src])

    def outside_d(self) -> list[str]:
        """Names outside ``d`` of files that have a name in ``d`` too."""
        return sorted(
            n
            for g in self.links
            if any(m.startswith("d/") for m in g)
            for n in g
            if not n.startswith("d/")
        )

    @precondition(lambda self: self.batch is None)
    @rule(data=st.data(), buf=data, exchange=st.booleans())
    def move_dir_while_writing(self, data: st.DataObject, buf: bytes, exchange: bool) -> None:
        """An append through a name (one outside ``d`` of a file with a name in it, if
        there is one), then at once (its commit queued) a rename of ``d``, or its exchange
        with the empty ``e``, another append, and the way back: a hard link's name in
        ``d`` is journaled with each write as it was at the write."""
        outside = self.outside_d()
        name = data.draw(st.sampled_from(outside) if outside else names)
        if name not in self.view:
            return
        away = b"e" if exchange else b"d.moved"
        d, there = os.fsencode(self.top / "d"), os.fsencode(self.top) + b"/" + away
        moved = os.fsencode(self.p(name))
        if name.startswith("d/"):
            moved = there + b"/" + os.fsencode(name[2:])
        with open(self.p(name), "ab") as f:
            f.write(buf)
        renameat2(-100, d, -100, there, 2 if exchange else 0)  # (AT_FDCWD; EXCHANGE)
        with open(moved, "ab") as f:
            f.write(buf)
        renameat2(-100, there, -100, d, 2 if exchange else 0)
        self.write(name, self.view[name] + buf + buf)

    @precondition(lambda self: self.batch is None and self.steps >= 15 and not self.remounted)
    @rule(data=st.data(), buf=data, exchange=st.booleans())
    def remount_then_move_dir(self, data: st.DataObject, buf: bytes, exchange: bool) -> None:
        """A file with a name in ``d`` and one outside it (linked now, if none is); a clean
        unmount, fsck of the journal against the tree, and a mount again, which knows
        none of the names until they are looked up; then a write through the name outside
        ``d`` and a rename or an exchange of ``d`` at once (``move_dir_while_writing``)."""
        if not self.outside_d():
            pairs = [
                (a, b)
                for a in NAMES
                for b in NAMES
                if a in self.view
                and b not in self.view
                and a.startswith("d/") != b.startswith("d/")
            ]
            if not pairs:
                return
            self.link(*data.draw(st.sampled_from(pairs)))
        self.remounted = True
        Run.remounts += 1
        Run.mount.stop()
        res = Run.mount.fsck()
        assert res.returncode == 0, res.stdout + res.stderr
        Run.mount.start()
        self.move_dir_while_writing(data, buf, exchange)

    # ---- snapshots, restore, batches, undo ----

    @precondition(lambda self: len(self.snaps) < 3)
    @rule()
    def snapshot(self) -> None:
        name = f"{self.run}-s{len(self.snaps)}"
        (self.rw / "snapshots" / name).mkdir()
        # A snapshot names a point of the journal: a batch's drafts are not in it.
        self.snaps[name] = dict(self.committed)

    @precondition(lambda self: self.snaps and self.batch is None)
    @rule(data=st.data(), whole=st.booleans())
    def restore(self, data: st.DataObject, whole: bool) -> None:
        snap = data.draw(st.sampled_from(sorted(self.snaps)))
        then = self.snaps[snap]
        if whole:  # the whole run's directory (other runs share the workspace)
            verb = f"restore {snap} {self.run}"
            wanted = set(then) | set(self.view)
        else:
            name = data.draw(names)
            verb = f"restore {snap} {shlex.quote(os.path.join(self.run, name))}"
            wanted = {name}
        changes = {n: (self.view.get(n), then.get(n)) for n in wanted}
        changes = {n: c for n, c in changes.items() if c[0] != c[1]}
        # As the restore does it: removals first, then each write, checked against what
        # the path held when the restore began; a hard-linked file is written in place,
        # so its other names change with it (and may then no longer be what they were).
        conflicts = 0
        order = sorted(changes.items(), key=lambda kv: (kv[1][1] is not None, os.fsencode(kv[0])))
        for n, (now, want) in order:
            if self.view.get(n) == want:
                continue
            if self.view.get(n) != now:
                conflicts += 1
            elif want is None:
                self.replace(n, None)
            elif n in self.view:
                self.write(n, want)
            else:
                self.set(n, want)
        # A path the journal has no version of (nothing under it was ever committed) names
        # nothing a restore could bring back: the verb fails, and nothing changes.
        known = bool(self.saves) if whole else name in self.saves
        assert known or not changes
        try:
            ctl(self.rw / "ctl", verb)
        except OSError as exc:
            if not known:
                assert exc.errno == errno.EINVAL, exc
                return
            assert (exc.errno, conflicts > 0) == (errno.ESTALE, True), exc
        else:
            assert known and conflicts == 0

    @precondition(lambda self: self.batch is None)
    @rule()
    def batch_open(self) -> None:
        self.batches += 1
        self.batch = f"{self.run}-b{self.batches}"
        (self.rw / "batches" / self.batch).mkdir()
        self.batch_base = dict(self.committed)
        self.links_base = [set(g) for g in self.links]
        self.linked_in_batch = False

    @precondition(lambda self: self.batch is not None)
    @rule()
    def batch_commit(self) -> None:
        assert self.batch is not None
        ctl(self.rw / "batches" / self.batch / "ctl", "commit")
        base = self.batch_base
        changes = {
            n: (base.get(n), self.view.get(n))
            for n in set(base) | set(self.view)
            if base.get(n) != self.view.get(n)
        }
        # Undo names the paths the journal recorded, one of a linked file's names: not
        # modelled (the matrix test covers undo of a write through a link).
        self.last = None if self.linked_in_batch else (self.batch, changes)
        self.batch = None
        self.made = set()
        self.commit_model({n: new for n, (_, new) in changes.items()})

    @precondition(lambda self: self.batch is not None)
    @rule()
    def batch_abort(self) -> None:
        assert self.batch is not None
        ctl(self.rw / "batches" / self.batch / "ctl", "abort")
        self.batch = None
        self.made = set()
        self.view = dict(self.committed)
        self.links = self.links_base

    @precondition(lambda self: self.last is not None and self.batch is None)
    @rule()
    def undo_last_batch(self) -> None:
        assert self.last is not None
        name, changes = self.last
        self.last = None
        if not changes:
            return  # an empty batch: nothing to undo
        back = {n: old for n, (old, new) in changes.items() if self.committed.get(n) == new}
        # A path that holds the bytes the undo would give it is already undone (landed).
        done = {n for n, (old, _) in changes.items() if self.committed.get(n) == old}
        try:
            ctl(self.rw / "ctl", f"undo {name}")
        except OSError as exc:
            # A path changed since the batch is a conflict; the others are undone.
            assert exc.errno == errno.ESTALE and len(back) + len(done) < len(changes), exc
        else:
            assert len(back) + len(done) == len(changes)
        for n, body in back.items():
            self.replace(n, body) if body is None else self.write(n, body)

    # ---- the checks after every step ----

    @invariant()
    def mount_shows_the_model(self) -> None:
        self.steps += 1  # (the invariants run once at the start, then after every step)
        assert files(self.top) == self.view

    @invariant()
    def linked_names_are_one_file(self) -> None:
        inodes: dict[int, set[str]] = {}
        for name in self.view:
            inodes.setdefault(os.stat(self.p(name)).st_ino, set()).add(name)
        got = sorted(sorted(g) for g in inodes.values() if len(g) > 1)
        assert got == sorted(sorted(g) for g in self.links)

    @invariant()
    def snapshots_show_their_point(self) -> None:
        for snap, then in self.snaps.items():
            tree = self.rw / "snapshots" / snap / "tree" / self.run
            assert files(tree) == then, snap

    @invariant()
    def history_lists_every_committed_version(self) -> None:
        hist = self.rw / "history" / self.run
        for name, saves in self.saves.items():
            top = hist / name
            listed = [(top / v).read_bytes() for v in sorted(os.listdir(top))]
            # An O_TRUNC open that wrote nothing (write_bytes(b"")) is committed at the
            # RELEASE the kernel sends after close() returned: wait for it, boundedly.
            for _ in range(50):
                if name not in self.committed or listed[-1:] == [self.committed[name]]:
                    break
                time.sleep(0.1)
                listed = [(top / v).read_bytes() for v in sorted(os.listdir(top))]
            missing = [s for s in saves if s and s not in listed]
            assert not missing, (name, missing, listed)
            assert all(a != b for a, b in zip(listed, listed[1:], strict=False)), (name, listed)
            if name in self.committed:
                assert listed[-1] == self.committed[name], (name, listed)
        shown = {
            os.path.relpath(os.path.join(d, n), hist)
            for d, dirs, _ in os.walk(hist)
            for n in dirs
            if not n[:6].isdigit()
        }
        temporaries = {p for p in shown if "Q7x9Zk" in p}
        assert not temporaries, temporaries

    def teardown(self) -> None:
        Run.steps += max(self.steps, 0)
        Run.longest = max(Run.longest, self.steps)
        if self.batch is not None:
            ctl(self.rw / "batches" / self.batch / "ctl", "abort")


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    ws = tmp_path_factory.mktemp("features") / "ws"
    ws.mkdir()
    # The model is about keeping every byte, not about judging it: the gates are off.
    prepare_state(ws, GATES_OFF)
    m = Mount(ws).start()
    try:
        Run.mount = m
        yield m
    finally:
        m.stop()
    check_clean(m)


def test_features_agree_with_a_plain_model(mounted: Mount) -> None:
    run_state_machine_as_test(
        Features,
        settings=settings(
            max_examples=int(os.environ.get("RWFS_MODEL_EXAMPLES", "12")),
            stateful_step_count=int(os.environ.get("RWFS_MODEL_STEPS", "30")),
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            phases=[Phase.generate] if os.environ.get("RWFS_MODEL_NOSHRINK") else list(Phase),
        ),
    )
    print(
        f"model: {Run.n} runs, {Run.steps} steps, the longest {Run.longest}, "
        f"{Run.remounts} remounts"
    )
