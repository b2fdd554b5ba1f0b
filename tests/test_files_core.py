"""The commit decision (``files.Files``, SPEC §3.2) in-process, without a mount: a real
``Workspace`` on a temporary tree, the committer running in trio, and a fake kernel that
records what the core asked of it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from rwfs.core import direct
from rwfs.core.batches import Batches
from rwfs.core.commits import Commit
from rwfs.core.errors import RwfsError
from rwfs.core.files import Files
from rwfs.core.inodes import Inode, InodeTable
from rwfs.core.stages import Stage
from rwfs.core.workspace import Workspace
from rwfs.journal.store import Store
from rwfs.policy import Policy

WHO = {"pid": 4242, "comm": "test", "uid": os.getuid()}


class FakeKernel:
    """Records each request the core makes of the kernel's caches."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def invalidate(self, inode: Inode) -> None:
        self.calls.append(("invalidate", inode.ino))

    async def invalidate_now(self, inode: Inode) -> None:
        self.calls.append(("invalidate_now", inode.ino))

    def drop_entry(self, path: bytes) -> None:
        self.calls.append(("drop_entry", path))

    def tree_changed(self, path: bytes) -> None:
        self.calls.append(("tree_changed", path))


class Core:
    def __init__(self, ws: Workspace, tree: Path) -> None:
        self.ws = ws
        self.tree = tree
        self.batches = Batches(ws)
        st = os.fstat(ws.root_fd)
        self.inodes = InodeTable((st.st_dev, st.st_ino))
        self.kernel = FakeKernel()
        self.files = Files(ws, self.batches, self.inodes, self.kernel)
        ws.committer.on_committed = self.files.committed
        ws.on_gone = self.files.gone

    def inode(self, name: str) -> Inode:
        path = name.encode()
        return self.inodes.resolve(path, os.stat(self.tree / name, follow_symlinks=False))

    async def write(self, inode: Inode, data: bytes) -> None:
        """What a write through the mount does: open a stage, write into it (from 0)."""
        inode.handles += 1  # an open handle, as fs.open counts it
        await self.files.ensure_stage(inode, truncate=True)
        assert inode.stage is not None
        os.pwrite(inode.stage.fd, data, 0)
        inode.stage.wrote(0, len(data))

    async def close(self, inode: Inode, wait: bool = False) -> None:
        """The handle's commit point, then its release."""
        try:
            await self.files.commit(inode, WHO, wait)
        finally:
            inode.handles -= 1
            self.files.release_fd(inode)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / ".rw").mkdir(parents=True)
    return root


Run = Callable[[Path, Callable[["Core"], Awaitable[None]]], "Core"]


@pytest.fixture
def run() -> Any:
    """Run ``body`` with a core over ``tree``, the committer running; the journal stays
    open until the test ends, for its assertions."""
    opened: list[Any] = []

    def go(tree: Path, body: Callable[[Core], Awaitable[None]]) -> Core:
        root_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
        state_fd = os.open(tree / ".rw", os.O_RDONLY | os.O_DIRECTORY)
        store = Store(str(tree / ".rw" / "journal"))
        opened.append((store, root_fd, state_fd))
        ws = Workspace(root_fd, state_fd, store, Policy())
        core = Core(ws, tree)

        async def main() -> None:
            ws.committer.open_intents()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ws.committer.run)
                try:
                    await body(core)
                finally:
                    await ws.committer.close()
                    nursery.cancel_scope.cancel()

        trio.run(main)
        return core

    yield go
    for store, root_fd, state_fd in opened:
        store.close()
        os.close(root_fd)
        os.close(state_fd)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def ops(core: Core, path: str) -> list[str]:
    return [e["op"] for e in core.ws.store.events(path=path)]


def test_same_bytes_are_a_noop_and_nothing_is_queued(tree: Path, run: Run) -> None:
    (tree / "a.txt").write_bytes(b"same\n")
    before = os.stat(tree / "a.txt").st_ino

    async def body(core: Core) -> None:
        i = core.inode("a.txt")
        await core.write(i, b"same\n")
        await core.close(i)
        assert i.stage is None and i.pending is None  # dropped at once, nothing queued
        assert core.ws.committer.unsettled() == []

    core = run(tree, body)
    assert (tree / "a.txt").read_bytes() == b"same\n"
    assert os.stat(tree / "a.txt").st_ino == before  # never replaced
    assert ops(core, "a.txt") == ["noop"]
    assert os.listdir(tree / ".rw" / "staging") == []


def test_a_gate_refusal_keeps_the_file_and_drops_the_kernels_pages(tree: Path, run: Run) -> None:
    good = b"def f():\n    return 1\n"
    (tree / "m.py").write_bytes(good)
    refused: list[RwfsError] = []

    async def body(core: Core) -> None:
        i = core.inode("m.py")
        await core.write(i, b"def f(:\n    return 1\n")
        with pytest.raises(RwfsError) as exc:
            await core.close(i)
        refused.append(exc.value)
        assert i.stage is None and i.pending is None  # the file reads as before
        assert ("invalidate_now", i.ino) in core.kernel.calls  # a reread must not see the draft
        assert i.version == 0  # no new version: nothing changed

    core = run(tree, body)
    assert refused and refused[0].errno != 0
    assert (tree / "m.py").read_bytes() == good
    assert ops(core, "m.py") == ["refuse"]
    assert os.listdir(tree / ".rw" / "staging") == []


def test_a_commit_is_queued_then_committed_and_the_inode_follows_the_live_file(
    tree: Path, run: Run
) -> None:
    (tree / "b.txt").write_bytes(b"old\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        i = core.inode("b.txt")
        await core.write(i, b"new\n")
        await core.files.commit(i, WHO)
        seen["queued"] = i.pending is not None and core.ws.committer.is_queued(i.pending)
        seen["before_sync"] = (tree / "b.txt").read_bytes()
        await core.ws.committer.sync()
        await core.files.settle(i)
        seen["pending"], seen["stage"] = i.pending, i.stage
        seen["version"] = i.version
        # The committed stage's descriptor is the backing file now, the inode rekeyed.
        st = os.stat(tree / "b.txt")
        seen["backing"] = os.fstat(i.fd).st_ino == st.st_ino
        seen["keyed"] = core.inodes.by_key.get((st.st_dev, st.st_ino)) is i
        i.handles -= 1
        core.files.release_fd(i)
        seen["closed"] = i.fd

    core = run(tree, body)
    assert seen["queued"] is True
    assert seen["before_sync"] == b"old\n"  # queued: the tree unchanged until the flush
    assert seen["pending"] is None and seen["stage"] is None
    assert seen["version"] == 1
    assert seen["backing"] is True and seen["keyed"] is True
    assert seen["closed"] == -1
    assert (tree / "b.txt").read_bytes() == b"new\n"
    assert ops(core, "b.txt") == ["write"]


@pytest.mark.parametrize("held", [True, False], ids=["open", "idle"])
def test_a_file_rwfs_replaces_itself_is_found_by_its_new_backing_key_only(
    tree: Path, run: Run, held: bool
) -> None:
    """rwfs's own commit of a path (a restore, an undo: no owner) while the kernel knows
    the file: idle, the inode follows the new backing file; open, it stays the replaced
    file, which no name reaches now, and the table must no longer find it by that
    file's backing key: freed, its inode number may be given to any new file, which was
    then taken for this inode (two names, one inode)."""
    (tree / "f").write_bytes(b"old\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        i = core.inode("f")
        old_key = i.key
        i.handles += held
        (tree / "tmp").write_bytes(b"new\n")
        os.rename(tree / "tmp", tree / "f")  # what the landing step does
        st = os.stat(tree / "f")
        c = Commit(b"f", Stage(-1, b"", sha(b"old\n")), sha(b"new\n"), 4, {})
        c.outcome = "committed"
        core.files.committed(c)
        seen["old"] = core.inodes.by_key.get(old_key) is i
        seen["new"] = core.inodes.by_key.get((st.st_dev, st.st_ino)) is i
        seen["invalidated"] = ("invalidate", i.ino) in core.kernel.calls

    run(tree, body)
    assert seen["old"] is False
    assert seen["new"] is not held
    assert seen["invalidated"] is True


def test_an_open_batch_holds_the_commit_until_it_commits(tree: Path, run: Run) -> None:
    (tree / "c.txt").write_bytes(b"base\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        batch = await core.batches.open(b"work", WHO)
        i = core.inode("c.txt")
        await core.write(i, b"draft 1\n")
        await core.close(i)
        held = core.files.held(i)
        seen["held"] = held is not None and held.batch == "work"
        seen["live"] = (tree / "c.txt").read_bytes()
        # The next write builds on the batch's draft, against the batch's base.
        assert held is not None
        i.handles += 1
        await core.files.ensure_stage(i)
        assert i.stage is not None and i.stage is not held.stage
        seen["from_draft"] = os.pread(i.stage.fd, 100, 0)
        os.pwrite(i.stage.fd, b"draft 2\n", 0)
        i.stage.wrote(0, 8)
        await core.close(i)
        now = core.files.held(i)
        seen["one_draft"] = list(batch.held) == [b"c.txt"] and batch.held[b"c.txt"] is now
        seen["intended"] = now.intended if now is not None else None
        await core.batches.commit(batch)
        await core.ws.committer.sync()
        seen["after"] = i.pending

    run(tree, body)
    assert seen["held"] is True
    assert seen["live"] == b"base\n"  # held: the tree keeps its bytes until the batch commits
    assert seen["from_draft"] == b"draft 1\n"
    assert seen["one_draft"] is True  # the batch's draft of the file replaced, not added
    assert seen["intended"] == "sha256:" + hashlib.sha256(b"draft 2\n").hexdigest()
    assert seen["after"] is None
    assert (tree / "c.txt").read_bytes() == b"draft 2\n"


def test_a_batch_draft_back_to_its_base_is_let_go(tree: Path, run: Run) -> None:
    (tree / "d.txt").write_bytes(b"base\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        batch = await core.batches.open(b"back", WHO)
        i = core.inode("d.txt")
        await core.write(i, b"changed\n")
        await core.close(i)
        seen["held"] = b"d.txt" in batch.held
        await core.write(i, b"base\n")
        await core.close(i)
        seen["after"] = b"d.txt" in batch.held
        seen["pending"] = i.pending

    run(tree, body)
    assert seen["held"] is True
    assert seen["after"] is False and seen["pending"] is None  # no change left to hold
    assert (tree / "d.txt").read_bytes() == b"base\n"


def test_a_stage_unlinked_before_its_commit_point_is_dropped_not_committed(
    tree: Path, run: Run
) -> None:
    (tree / "e.txt").write_bytes(b"old\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        i = core.inode("e.txt")
        await core.write(i, b"new\n")
        os.unlink(tree / "e.txt")
        core.inodes.detach(b"e.txt")
        i.handles -= 1  # the last handle: its commit point finds no path
        await core.files.commit(i, WHO)
        seen["stage"], seen["pending"] = i.stage, i.pending

    core = run(tree, body)
    assert seen["stage"] is None and seen["pending"] is None
    assert not (tree / "e.txt").exists()
    assert ops(core, "e.txt") == []
    assert os.listdir(tree / ".rw" / "staging") == []


def test_a_batchs_new_file_is_virtual_until_the_batch_commits(tree: Path, run: Run) -> None:
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        batch = await core.batches.open(b"new", WHO)

        async def create(name: bytes, data: bytes) -> Inode:
            # What fs.create does for a writer an open batch takes: only a stage.
            i = core.inodes.add_virtual(name)
            i.stage = await core.ws.stages.empty(0o644, os.getuid(), os.getgid())
            core.files.virtual[name] = i
            i.handles += 1
            os.pwrite(i.stage.fd, data, 0)
            i.stage.wrote(0, len(data))
            await core.close(i)
            return i

        kept = await create(b"kept.txt", b"kept\n")
        dropped = await create(b"dropped.txt", b"dropped\n")
        seen["held"] = sorted(batch.held)
        seen["in_tree"] = sorted(os.listdir(tree))
        await core.files.names.drop_virtual(dropped, WHO)  # unlink of the batch's new file
        seen["after_drop"] = sorted(batch.held)
        seen["virtual"] = sorted(core.files.virtual)
        await core.batches.commit(batch)
        seen["kept"] = (kept.virtual, kept.pending, b"kept.txt" in core.files.virtual)

    run(tree, body)
    assert seen["held"] == [b"dropped.txt", b"kept.txt"]
    assert seen["in_tree"] == [".rw"]  # held: nothing in the tree before the batch commits
    assert seen["after_drop"] == [b"kept.txt"]  # the batch forgot the dropped file
    assert seen["virtual"] == [b"kept.txt"]
    assert seen["kept"] == (False, None, False)  # committed: the tree's file now
    assert sorted(os.listdir(tree)) == [".rw", "kept.txt"]
    assert (tree / "kept.txt").read_bytes() == b"kept\n"


def test_an_unlink_a_batch_takes_hides_the_file_until_the_batch_commits(
    tree: Path, run: Run
) -> None:
    (tree / "gone.txt").write_bytes(b"bytes\n")
    (tree / "other.txt").write_bytes(b"other\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        outside = await core.files.names.hide(b"other.txt", core.inode("other.txt"), WHO)
        seen["outside"] = (outside, sorted(core.files.hidden))
        batch = await core.batches.open(b"rm", WHO)
        i = core.inode("gone.txt")
        seen["hidden"] = await core.files.names.hide(b"gone.txt", i, WHO)
        seen["view"] = (sorted(core.files.hidden), b"gone.txt" in core.inodes.by_path)
        seen["entry"] = batch.held[b"gone.txt"].intended
        seen["in_tree"] = (tree / "gone.txt").exists()
        # Any rename a batch would have to take is EXDEV (mv copies instead).
        seen["rename"] = core.files.names.batch_rename(b"other.txt", b"moved.txt", WHO)
        await core.batches.commit(batch)
        seen["after"] = sorted(core.files.hidden)

    core = run(tree, body)
    assert seen["outside"] == (False, [])  # no open batch: an ordinary unlink
    assert seen["hidden"] is True
    assert seen["view"] == ([b"gone.txt"], False)  # gone from the view
    assert seen["entry"] is None  # the batch holds a deletion
    assert seen["in_tree"] is True  # the real file stays until the batch commits
    assert seen["rename"] is True
    assert seen["after"] == []
    assert not (tree / "gone.txt").exists()
    assert ("drop_entry", b"gone.txt") in core.kernel.calls  # the kernel looks it up again
    assert (tree / "other.txt").read_bytes() == b"other\n"


def test_a_run_sessions_batch_commits_its_changes_as_the_sessions(tree: Path, run: Run) -> None:
    # A batch of scope run is its session's: the events of its commit carry the session,
    # and each the pid and comm of its own change's writer, a deletion's as a write's.
    (tree / "gone.txt").write_bytes(b"bytes\n")
    (tree / "kept.txt").write_bytes(b"old\n")
    rm = {"pid": 4343, "comm": "rm", "uid": os.getuid(), "session": "run-7"}

    async def body(core: Core) -> None:
        batch = await core.batches.open(b"run-7-review", WHO)
        batch.record["scope"] = {"kind": "run", "session": "run-7"}
        assert await core.files.names.hide(b"gone.txt", core.inode("gone.txt"), rm)
        i = core.inode("kept.txt")
        await core.write(i, b"mine\n")
        await core.files.commit(i, {**rm, "comm": "sh"})  # the session's: the batch's now
        i.handles -= 1
        await core.write(i, b"new\n")
        await core.close(i)  # (WHO: a writer outside the session, into the batch's file)
        await core.batches.commit(batch)

    core = run(tree, body)
    got = {e["path"]: e for e in core.ws.store.events() if e.get("batch") == "run-7-review"}
    assert (got["gone.txt"]["op"], got["kept.txt"]["op"]) == ("unlink", "write")
    assert {k: got["gone.txt"].get(k) for k in rm} == rm
    assert {k: got["kept.txt"].get(k) for k in rm} == {**WHO, "session": "run-7"}
    assert not (tree / "gone.txt").exists()


def test_a_hard_linked_file_is_committed_into_its_inode_and_journaled_for_both_names(
    tree: Path, run: Run
) -> None:
    (tree / "d").mkdir()
    (tree / "a.txt").write_bytes(b"one\n")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        a = core.inode("a.txt")
        await core.files.names.link(a, b"d/b.txt", WHO)
        b = core.inode("d/b.txt")
        seen["same"] = a is b  # one file, one inode: found by the backing key
        await core.write(b, b"two\n")
        await core.close(b, wait=True)
        await core.files.settle(b)

    core = run(tree, body)
    assert seen["same"] is True
    assert os.stat(tree / "a.txt").st_ino == os.stat(tree / "d" / "b.txt").st_ino
    assert (tree / "a.txt").read_bytes() == b"two\n"
    (write,) = [e for e in core.ws.store.events() if e["op"] == "write"]
    assert sorted([write["path"], *write["links"]]) == ["a.txt", "d/b.txt"]
    paths = core.ws.store.paths()
    assert paths[b"a.txt"]["digest"] == paths[b"d/b.txt"]["digest"] == write["intended"]
    assert os.listdir(tree / ".rw" / "staging") == []


def test_a_stale_write_refused_while_the_change_it_lost_lands(tree: Path, run: Run) -> None:
    """``stale_write = "conflict"``: a reader's write is refused over a hard-linked file's
    change still queued, and that change lands while the refusal waits for the journal's
    lock. The refusal still keeps what the mount showed: the bytes it compares against
    are the core's own duplicate, not the stage the landing commit closes."""
    (tree / "f.txt").write_bytes(b"old\n")
    os.link(tree / "f.txt", tree / "g.txt")
    reader = {**WHO, "pid": 4343}
    refused: list[RwfsError] = []

    async def body(core: Core) -> None:
        core.ws.policy.stale_write = "conflict"
        f = core.inode("f.txt")
        core.files.reads.opened_to_read(reader["pid"], f)
        await core.write(f, b"theirs\n")
        await core.close(f)  # queued, not landed
        assert f.pending is not None and core.ws.committer.is_queued(f.pending)
        exclusive = core.ws.committer.exclusive

        @contextlib.asynccontextmanager
        async def landing_first() -> AsyncIterator[None]:
            await core.ws.committer.sync()  # the committer takes the lock first and lands it
            async with exclusive():
                yield

        core.ws.committer.exclusive = landing_first  # type: ignore[method-assign]
        await core.write(f, b"mine\n")
        try:
            with pytest.raises(RwfsError) as exc:
                await core.files.commit(f, reader, False)
            refused.append(exc.value)
        finally:
            core.ws.committer.exclusive = exclusive  # type: ignore[method-assign]
            f.handles -= 1
            core.files.release_fd(f)

    core = run(tree, body)
    assert refused[0].errno == errno.ESTALE, refused[0]
    assert (tree / "f.txt").read_bytes() == (tree / "g.txt").read_bytes() == b"theirs\n"
    (conflict,) = [e for e in core.ws.store.events() if e["op"] == "conflict"]
    digests = [conflict[k] for k in ("expected", "intended", "actual")]
    assert digests == [sha(b"old\n"), sha(b"mine\n"), sha(b"theirs\n")]
    assert all(core.ws.objects.exists(d) for d in digests)


def test_a_file_removed_and_made_again_is_gated_against_the_removed_bytes(
    tree: Path, run: Run
) -> None:
    good = b"def f():\n    return 1\n"
    (tree / "m.py").write_bytes(good)
    refused: list[RwfsError] = []

    async def body(core: Core) -> None:
        core.inode("m.py")
        await core.files.names.remove(b"m.py", WHO, is_dir=False)
        (tree / "m.py").write_bytes(b"")  # what create makes: an empty file
        i = core.inode("m.py")
        await core.write(i, b"def f(:\n")
        with pytest.raises(RwfsError) as exc:
            await core.close(i)
        refused.append(exc.value)
        await core.ws.committer.sync()
        await core.files.settle(i)

    core = run(tree, body)
    assert refused and refused[0].envelope["error"] == "blocked"
    assert (tree / "m.py").read_bytes() == good  # the removed bytes are back
    got = [(e["op"], e.get("expected"), e.get("intended")) for e in core.ws.store.events()]
    digest = "sha256:" + hashlib.sha256(good).hexdigest()
    assert [g[0] for g in got] == ["unlink", "refuse", "write"]
    assert (got[1][1], got[2][2]) == (digest, digest)


def test_a_rename_between_two_names_of_one_file_does_nothing(tree: Path, run: Run) -> None:
    (tree / "a.txt").write_bytes(b"x\n")
    os.link(tree / "a.txt", tree / "b.txt")

    async def body(core: Core) -> None:
        await core.files.renames.rename(b"a.txt", b"b.txt", 0, WHO)
        with pytest.raises(FileExistsError):
            await core.files.renames.rename(b"a.txt", b"b.txt", 1, WHO)  # RENAME_NOREPLACE

    core = run(tree, body)
    assert sorted(os.listdir(tree)) == [".rw", "a.txt", "b.txt"]
    assert [e for e in core.ws.store.events() if e["op"] == "rename"] == []


def test_removing_the_only_known_name_of_a_linked_file_finds_its_other_name(
    tree: Path, run: Run
) -> None:
    """A descriptor open on a.txt, whose file is also d/b.txt (linked behind the mount):
    after ``rm a.txt`` a write through the descriptor is the file's, under d/b.txt, and
    journaled there (it was written in place, unjournaled: fsck drift)."""
    (tree / "d").mkdir()
    (tree / "a.txt").write_bytes(b"one\n")
    os.link(tree / "a.txt", tree / "d" / "b.txt")
    seen: dict[str, Any] = {}

    async def body(core: Core) -> None:
        i = core.inode("a.txt")
        i.handles += 1  # open
        await core.files.names.remove(b"a.txt", WHO, is_dir=False)
        seen["paths"] = sorted(i.paths)
        await core.write(i, b"two\n")
        i.handles -= 1  # (core.write counted a handle of its own)
        await core.close(i, wait=True)
        await core.files.settle(i)

    core = run(tree, body)
    assert seen["paths"] == [b"d/b.txt"]
    assert (tree / "d" / "b.txt").read_bytes() == b"two\n"
    writes = [e for e in core.ws.store.events() if e["op"] == "write"]
    assert [(e["path"], e["intended"]) for e in writes] == [
        ("d/b.txt", "sha256:" + hashlib.sha256(b"two\n").hexdigest())
    ]


async def during_its_commit_point(core: Core, inode: Any, op: Any, *args: Any) -> None:
    """Close ``inode`` and, while its commit point is under way (sealed, waiting for a
    worker thread to hash it: every slot is taken here, as a collection, a group commit
    and other seals can take them), run ``op(*args)``; then let the threads go."""
    from rwfs.core.syscalls import WORKERS

    limiter = WORKERS
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for h in holders:
        await limiter.acquire_on_behalf_of(h)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(core.close, inode)  # the seal waits for a worker thread
        await trio.sleep(0.05)
        assert inode.stage is not None and inode.stage.sealed and inode.pending is None
        nursery.start_soon(op, *args)
        await trio.sleep(0.05)
        for h in holders:
            limiter.release_on_behalf_of(h)
    await core.ws.committer.sync()


def test_a_save_by_rename_during_its_temporary_files_commit_point_carries_its_bytes(
    tree: Path, run: Run
) -> None:
    """The rename of a temporary file whose commit point is under way (sealed, hashed
    in a worker thread, not queued yet) waits for that commit and carries it. It used to move the tree's empty temporary at once and journal that: a
    rename of the empty file, then the temporary's write under the new name, so the
    history of the target gained an empty version it never had."""
    (tree / "f.txt").write_bytes(b"old\n")
    (tree / ".t").write_bytes(b"")  # made empty, as a save's temporary is
    new = b"the new text of f.txt\n" * 2000  # past SEAL_ON_LOOP: hashed in a thread

    async def body(core: Core) -> None:
        t = core.inode(".t")
        core.inode("f.txt")
        await core.write(t, new)
        await during_its_commit_point(core, t, core.files.renames.rename, b".t", b"f.txt", 0, WHO)

    core = run(tree, body)
    assert (tree / "f.txt").read_bytes() == new and not (tree / ".t").exists()
    evs = [e for e in core.ws.store.events() if e["op"] in ("write", "rename")]
    digest = "sha256:" + hashlib.sha256(new).hexdigest()
    empty = "sha256:" + hashlib.sha256(b"").hexdigest()
    assert [(e["op"], e["path"], e["intended"]) for e in evs] == [
        ("write", ".t", digest),  # the temporary's bytes, where they were written
        ("rename", ".t", digest),  # then moved over f.txt
    ], evs
    assert empty not in [e["intended"] for e in evs]


@pytest.mark.parametrize("how", ["unlink", "rename over"])
def test_a_removal_during_a_commit_point_keeps_the_written_bytes_as_a_version(
    tree: Path, run: Run, how: str
) -> None:
    """An unlink of a file whose commit point is under way (or a rename over it) waits for
    the commit and keeps it as the removed version: the removal's event names the bytes
    written before it, not the older ones, and undo would bring those back."""
    (tree / "f.txt").write_bytes(b"old\n")
    (tree / "g.txt").write_bytes(b"other\n")
    new = b"the new text of f.txt\n" * 2000  # past SEAL_ON_LOOP: hashed in a thread

    async def body(core: Core) -> None:
        f = core.inode("f.txt")
        core.inode("g.txt")
        await core.write(f, new)
        if how == "unlink":
            await during_its_commit_point(core, f, core.files.names.remove, b"f.txt", WHO, False)
        else:
            await during_its_commit_point(
                core, f, core.files.renames.rename, b"g.txt", b"f.txt", 0, WHO
            )

    core = run(tree, body)
    digest = "sha256:" + hashlib.sha256(new).hexdigest()
    gone = [e for e in core.ws.store.events() if e["op"] in ("unlink", "rename")]
    assert len(gone) == 1 and gone[0]["expected"] == digest, gone


def test_a_rename_names_its_file_anew_before_it_waits(tree: Path, run: Run) -> None:
    """A rename over a hard-linked file waits (a worker thread looks for the replaced
    file's other names). An open meanwhile must see the moved file under its new,
    journaled name: seen under its old passthrough name, it would be passed through, and
    its writes would reach a journaled file around its stage."""
    (tree / "node_modules").mkdir()
    (tree / "node_modules" / "x.js").write_bytes(b"x\n")
    (tree / "main.py").write_bytes(b"y = 1\n")
    os.link(tree / "main.py", tree / "other.py")  # (a name the inode table has not seen)
    seen: dict[str, bool] = {}

    async def body(core: Core) -> None:
        moved = core.inode("node_modules/x.js")
        core.inode("main.py")
        searching, found = threading.Event(), threading.Event()
        other_names = core.ws.links.other_names

        def slow(*args: Any) -> Any:
            searching.set()
            found.wait(10)
            return other_names(*args)

        core.ws.links.other_names = slow  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(core.files.renames.rename, b"node_modules/x.js", b"main.py", 0, WHO)
            while not searching.is_set():
                await trio.sleep(0.01)
            seen["undecided"] = direct.undecided(
                core.files, moved, os.stat(tree / "main.py", follow_symlinks=False)
            )
            found.set()

    run(tree, body)
    assert seen == {"undecided": False}
    assert (tree / "main.py").read_bytes() == b"x\n"
    assert (tree / "other.py").read_bytes() == b"y = 1\n"


def test_spares_are_made_when_they_run_low_and_stages_take_them(tree: Path, run: Run) -> None:
    from rwfs.core import stages

    made_before: list[bytes] = []
    staged: list[bytes] = []

    async def body(core: Core) -> None:
        st = core.ws.stages
        async with trio.open_nursery() as nursery:
            nursery.start_soon(st.keep_spares)
            (core.tree / "a.txt").write_bytes(b"")
            inode = core.inode("a.txt")
            await core.write(inode, b"one\n")  # the pool is empty: its stage asks for spares
            with trio.fail_after(30):
                while len(st._made) < stages.SPARES_FILL:
                    await trio.sleep(0.01)
            made_before.extend(st._made)
            await core.close(inode)
            (core.tree / "b.txt").write_bytes(b"")
            b = core.inode("b.txt")
            await core.write(b, b"two\n")
            assert b.stage is not None
            staged.append(b.stage.name)
            await core.close(b)
            nursery.cancel_scope.cancel()
        st.let_go_spares()

    run(tree, body)
    assert staged[0] in made_before
    assert (tree / "b.txt").read_bytes() == b"two\n"
    left = set(os.listdir(tree / ".rw" / "staging"))
    assert not left & {n.decode() for n in made_before}


def test_spares_stop_being_made_when_none_can_be(tree: Path, run: Run) -> None:
    tries: list[int] = []

    async def body(core: Core) -> None:
        st = core.ws.stages
        make = st._make_spares

        def refused(n: int) -> int:
            tries.append(n)
            return 0  # (as when the disk has no inode left)

        st._make_spares = refused  # type: ignore[method-assign]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(st.keep_spares)
                st._low.set()
                await trio.sleep(0.3)
                nursery.cancel_scope.cancel()
        finally:
            st._make_spares = make  # type: ignore[method-assign]
        st.ws.staging_fd, real = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY), st.ws.staging_fd
        try:
            assert st._make_spares(4) == 0  # a directory that takes no file: none pooled
        finally:
            os.close(st.ws.staging_fd)
            st.ws.staging_fd = real
        assert st._pooled() == 0

    run(tree, body)
    assert len(tries) == 1, "keep_spares tried again without being asked"
