"""The history index in-process (no mount): timelines, lineage and what history/ lists,
for the event sequences real programs' saves leave in the journal."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rwfs.features.history import History
from rwfs.journal import timelines
from rwfs.journal.objects import EMPTY_DIGEST
from rwfs.journal.store import Store, u64

OLD, V1, V2, V3, OTHER = (f"sha256:{c * 64}" for c in "abcde")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(str(tmp_path / "journal"))
    yield s
    s.close()


def journal(store: Store, *events: dict[str, Any]) -> list[int]:
    """Append the events; return their LSNs."""
    lsns = []
    for ev in events:
        lsns.append(store.write(lambda txn, ev=ev: txn.append_event(dict(ev))))
    return lsns


def create(p: str) -> dict[str, Any]:
    return {"op": "create", "path": p, "intended": EMPTY_DIGEST}


def write(p: str, old: str | None, new: str) -> dict[str, Any]:
    return {"op": "write", "path": p, "expected": old, "intended": new}


def rename(src: str, dst: str, replaced: str | None, moved: str | None) -> dict[str, Any]:
    return {"op": "rename", "path": src, "dest": dst, "expected": replaced, "intended": moved}


def unlink(p: str, old: str) -> dict[str, Any]:
    return {"op": "unlink", "path": p, "expected": old}


def digests(h: History, p: str) -> list[str | None]:
    return [v.digest for v in h.versions(p.encode())]


def sed_i(store: Store, target: str, tmp: str, old: str | None, new: str) -> list[int]:
    """What `sed -i` leaves: a temporary created, written, renamed over the target."""
    return journal(store, create(tmp), write(tmp, EMPTY_DIGEST, new), rename(tmp, target, old, new))


def test_a_save_by_rename_is_one_version_of_the_target(store: Store) -> None:
    (before,) = journal(store, write("c.txt", OTHER, V3))
    sed_i(store, "a.py", "sedAbc123", OLD, V1)
    sed_i(store, "a.py", "sedDef456", V1, V2)
    h = History(store)
    # Version 0 is the target's bytes before rwfs changed it; no empty version.
    assert digests(h, "a.py") == [OLD, V1, V2]
    # Snapshots and restore: the target existed throughout, with its old bytes.
    assert h.state_at(b"a.py", before) == (True, OLD)
    assert h.state_at(b"sedAbc123", before) == (True, None)  # made since
    # The temporaries held nothing the target's history does not: not listed, still found.
    assert h.children(b"", listed=True) == {b"a.py", b"c.txt"}
    assert h.children(b"") == {b"a.py", b"c.txt", b"sedAbc123", b"sedDef456"}
    assert digests(h, "sedAbc123") == [V1]


def test_os_replace_of_a_file_the_journal_never_saw(store: Store) -> None:
    """A temporary under a passthrough name: only the rename is journaled."""
    (before,) = journal(store, write("c.txt", OTHER, V3))
    journal(store, rename("b.tmp", "b.py", OLD, V1))
    h = History(store)
    assert digests(h, "b.py") == [OLD, V1]
    assert h.state_at(b"b.py", before) == (True, OLD)
    assert h.state_at(b"b.tmp", before) == (True, V1)  # it existed, with those bytes
    assert h.children(b"", listed=True) == {b"b.py", b"c.txt"}


def test_a_move_to_a_free_name_carries_the_files_history(store: Store) -> None:
    lsns = journal(
        store,
        create("app.py"),
        write("app.py", EMPTY_DIGEST, V1),
        write("app.py", V1, V2),
        rename("app.py", "main.py", None, V2),
        write("main.py", V2, V3),
    )
    h = History(store)
    assert digests(h, "app.py") == [V1, V2]
    assert digests(h, "main.py") == [V1, V2, V3]
    # The name main.py did not exist before the move; app.py did not after it.
    assert h.state_at(b"main.py", lsns[2]) == (True, None)
    assert h.state_at(b"app.py", lsns[4]) == (False, None)
    assert h.children(b"", listed=True) == {b"main.py"}


def test_a_removed_file_with_bytes_of_its_own_stays_listed(store: Store) -> None:
    journal(store, write("keep.txt", OLD, V1), write("gone.txt", OTHER, V2), unlink("gone.txt", V2))
    journal(store, write("copy.txt", None, V1), unlink("copy.txt", V1))
    h = History(store)
    assert h.children(b"", listed=True) == {b"keep.txt", b"gone.txt"}
    assert digests(h, "gone.txt") == [OTHER, V2]


def test_an_editor_backup_rename_keeps_version_zero(store: Store) -> None:
    """vim's save: rename the file to a backup name, write a new file, remove the backup."""
    (before,) = journal(store, write("x.txt", OTHER, V3))
    journal(
        store,
        rename("a.py", "a.py~", None, OLD),
        create("a.py"),
        write("a.py", EMPTY_DIGEST, V1),
        unlink("a.py~", OLD),
    )
    h = History(store)
    assert digests(h, "a.py") == [OLD, V1]
    assert h.state_at(b"a.py", before) == (True, OLD)
    assert h.children(b"", listed=True) == {b"a.py", b"x.txt"}


def test_a_directory_rename_moves_the_files_below_it(store: Store) -> None:
    lsns = journal(
        store,
        write("d/a", OLD, V1),
        rename("d", "e", None, None),
        write("e/a", V1, V2),
    )
    h = History(store)
    assert digests(h, "e/a") == [OLD, V1, V2]
    assert h.state_at(b"e/a", lsns[0]) == (True, None)
    assert h.state_at(b"d/a", lsns[0]) == (True, V1)
    assert not h.has(b"d") and not h.has(b"e")  # directories have no timeline
    assert h.children(b"", listed=True) == {b"e"}


def test_an_exchange_swaps_what_each_name_holds(store: Store) -> None:
    lsns = journal(
        store,
        write("a", OLD, V1),
        write("b", OTHER, V2),
        {**rename("a", "b", None, None), "exchange": True},
    )
    h = History(store)
    assert h.state_at(b"a", lsns[1]) == (True, V1)
    assert h.state_at(b"a", lsns[2]) == (False, V2)
    assert h.state_at(b"b", lsns[2]) == (False, V1)


def test_a_new_file_lists_no_empty_start_but_an_empty_file_lists_its_bytes(store: Store) -> None:
    journal(store, create("new.py"), write("new.py", EMPTY_DIGEST, V1), create("empty"))
    h = History(store)
    assert digests(h, "new.py") == [V1]
    assert digests(h, "empty") == [EMPTY_DIGEST]


def test_lineage_of_names_swapped_back_and_forth_stays_small(store: Store) -> None:
    journal(store, write("a", OLD, V1), write("b", OTHER, V2))
    for _ in range(60):  # exponential if each hop were followed once per way in
        journal(store, {**rename("a", "b", None, None), "exchange": True})
    h = History(store)
    assert set(digests(h, "a")) == {OLD, OTHER, V1, V2}


def test_of_a_removed_target_and_its_temporary_only_the_target_is_listed(store: Store) -> None:
    sed_i(store, "c.py", ".rsync.Q7x9Zk", OLD, V1)
    journal(store, unlink("c.py", V1))
    h = History(store)
    assert h.children(b"", listed=True) == {b"c.py"}


@pytest.mark.parametrize("gone", ["rm", "mv"])
@pytest.mark.parametrize("exchange", [False, True])
def test_a_directory_moved_after_its_target_went_lists_no_temporary(
    store: Store, exchange: bool, gone: str
) -> None:
    """The model test's flake: a save by rename in ``d``, its target removed or moved out
    of ``d``, then ``d`` renamed away and back (or exchanged with ``e`` and back). The
    moves take nothing from the removed paths: their rows still say where each file
    went (the temporary's to the target), and that the target was removed, not renamed
    away, or where it was renamed to."""
    sed_i(store, "d/c.py", "d/.rsync.Q7x9Zkc.py", OLD, V1)
    if gone == "rm":
        journal(store, unlink("d/c.py", V1))
    else:
        journal(store, rename("d/c.py", "f.txt", None, V1))
    there = "e" if exchange else "d.moved"
    journal(
        store,
        {**rename("d", there, None, None), "exchange": exchange or None},
        {**rename(there, "d", None, None), "exchange": exchange or None},
    )
    h = History(store)
    assert h.children(b"d", listed=True) == ({b"c.py"} if gone == "rm" else set())
    assert digests(h, "d/c.py") == [OLD, V1]
    with h._rows() as r:
        assert r.row(b"d/.rsync.Q7x9Zkc.py")["w"] == "d/c.py"  # type: ignore[index]
        assert r.row(b"d/c.py").get("w") == (None if gone == "rm" else "f.txt")  # type: ignore[union-attr]


def test_a_temporary_whose_file_moved_on_and_was_removed_is_not_listed(store: Store) -> None:
    """A save by rename onto ``a.py``, then ``mv b.txt a.py``, ``mv a.py d/c.py`` and
    ``rm d/c.py``: the temporary's bytes are versions of ``d/c.py`` (its lineage), which
    is listed."""
    journal(store, write("b.txt", None, V2))
    sed_i(store, "a.py", ".rsync.Q7x9Zka.py", None, V1)
    journal(store, rename("b.txt", "a.py", V1, V2), rename("a.py", "d/c.py", None, V2))
    journal(store, unlink("d/c.py", V2))
    h = History(store)
    assert h.children(b"", listed=True) == {b"d"}
    assert h.children(b"d", listed=True) == {b"c.py"}
    assert set(digests(h, "d/c.py")) == {V1, V2}


def undo_of(store: Store, batch: str) -> dict[bytes, tuple[str | None, str | None]]:
    """What undoing ``batch`` would do: path -> (bytes now, bytes after the undo)."""
    from types import SimpleNamespace

    from rwfs.core.batches import Batches

    return Batches(SimpleNamespace(store=store)).protocol.changes_of(batch)  # type: ignore[arg-type]


def test_undo_of_a_save_by_removal_and_re_creation_gives_back_the_old_bytes(
    store: Store,
) -> None:
    """git checkout, vim's save, rm then a new file: three events in a row, one edit."""
    journal(
        store,
        {**unlink("f.py", OLD), "uid": 0, "batch": "auto-e1"},
        {**create("f.py"), "uid": 0, "batch": "auto-e2"},
        {**write("f.py", EMPTY_DIGEST, V1), "uid": 0, "batch": "auto-3"},
        {**rename("g.py", "g.py~", None, OTHER), "uid": 0, "batch": "auto-4"},
        {**create("g.py"), "uid": 0, "batch": "auto-e5"},
        {**write("g.py", EMPTY_DIGEST, V2), "uid": 0, "batch": "auto-6"},
    )
    assert undo_of(store, "auto-3") == {b"f.py": (V1, OLD)}
    assert undo_of(store, "auto-6") == {b"g.py": (V2, OTHER)}


def test_a_file_made_again_later_is_a_new_file_for_undo(store: Store) -> None:
    journal(
        store,
        {**rename("f.py", "elsewhere", None, OLD), "uid": 0},
        {**create("f.py"), "uid": 0},
        {**write("other", None, V3), "uid": 0},  # something else happened in between
        {**write("f.py", EMPTY_DIGEST, V1), "uid": 0, "batch": "b1"},
        {**unlink("h.py", OLD), "uid": 0},
        {**create("h.py"), "uid": 1000},  # made again by another user
        {**write("h.py", EMPTY_DIGEST, V2), "uid": 1000, "batch": "b2"},
    )
    assert undo_of(store, "b1") == {b"f.py": (V1, EMPTY_DIGEST)}
    assert undo_of(store, "b2") == {b"h.py": (V2, EMPTY_DIGEST)}


def every_answer(h: History) -> dict[str, Any]:
    """What the index answers about the paths of ``test_index_of_an_old_store…``."""
    paths = [b"a.py", b"sedAbc123", b"d/x", b"e/x", b"gone.txt", b"main.py", b"app.py"]
    return {
        "versions": {p: digests(h, p.decode()) for p in paths},
        "states": {(p, lsn): h.state_at(p, lsn) for p in paths for lsn in range(12)},
        "listed": h.children(b"", listed=True),
        "all": h.children(b""),
        "holders": {d: h.holders(d) for d in (OLD, V1, V2, V3, OTHER)},
    }


def test_the_index_of_an_old_store_is_built_once_and_answers_the_same(tmp_path: Path) -> None:
    """A store written before the history index: its events are indexed at the first
    open, and a build cut short goes on where it stopped."""
    s = Store(str(tmp_path / "journal"))
    sed_i(s, "a.py", "sedAbc123", OLD, V1)
    journal(s, write("d/x", OLD, V2), rename("d", "e", None, None), write("gone.txt", None, V3))
    journal(
        s, unlink("gone.txt", V3), write("app.py", OTHER, V1), rename("app.py", "main.py", None, V1)
    )
    want = every_answer(History(s))
    s.close()

    def forget(upto: int) -> None:
        """Empty the index, as an old rwfs left it, then index the events to ``upto`` as
        a build cut short there does."""
        s = Store(str(tmp_path / "journal"))
        events = list(s.events())
        with s.env.begin(write=True) as txn:
            for name in timelines.DBS:
                txn.drop(s.db[name], delete=False)
            rows = timelines.Rows(txn, s.db, s.max_key)
            for ev in events[:upto]:
                rows.apply(ev)
            txn.put(b"index:history", u64(0), db=s.db[b"meta"])
            txn.put(b"index:history_lsn", u64(upto), db=s.db[b"meta"])
        s.close()

    for upto in (0, 4):
        forget(upto)
        again = Store(str(tmp_path / "journal"))
        try:
            assert again.meta_int(b"index:history") == 1
            assert again.meta_int(b"index:history_lsn") == again.meta_int(b"lsn")
            assert every_answer(History(again)) == want
        finally:
            again.close()


def random_journal(store: Store, rnd: Any) -> None:
    """Up to 25 events over a few names: writes, creates, removals, renames (of files and
    directories, onto passthrough names too), exchanges, links and chmods."""
    names = ["a", "b", "d/a", "d/b", "e/a", "t1", "t2", "d", "e"]
    some = [OLD, V1, V2, V3, OTHER, EMPTY_DIGEST]
    for _ in range(rnd.randint(1, 25)):
        p, q, op = rnd.choice(names), rnd.choice(names), rnd.randrange(7)
        if op == 0:
            ev = create(p)
        elif op == 1:
            ev = write(p, rnd.choice([*some, None]), rnd.choice(some))
        elif op == 2:
            ev = unlink(p, rnd.choice(some))
        elif op == 3 and p != q:
            ev = rename(p, q, rnd.choice([*some, None]), rnd.choice([*some, None]))
            ev["untracked"] = rnd.random() < 0.1
        elif op == 4 and p != q:
            ev = {**rename(p, q, None, None), "exchange": True}
        elif op == 5:
            ev = {"op": "link", "path": p, "intended": rnd.choice(some)}
        else:
            ev = {"op": "setattr", "path": p, "mode": 0o600, "owner": [1, 2]}
        journal(store, ev)


@pytest.mark.parametrize("seed", range(300))
def test_history_lists_every_version_any_path_held(tmp_path: Path, seed: int) -> None:
    """What ``history/`` leaves out is only ever bytes a path it lists holds too: of any
    sequence of events, every version of every path is a version of a listed path, and
    every path that exists is listed."""
    import random

    s = Store(str(tmp_path / "journal"))
    try:
        random_journal(s, random.Random(seed))
        h = History(s)
        every = [p for p, _ in h.timelines()]
        listed = set()
        for top in [b"", *{p.rsplit(b"/", 1)[0] for p in every if b"/" in p}]:
            listed |= {top + b"/" + n if top else n for n in h.children(top, listed=True)}
        listed = {p for p in listed if h.has(p)}
        shown = {v.digest for p in listed for v in h.versions(p)}
        for p in every:
            assert {v.digest for v in h.versions(p)} <= shown, p
            if h.timeline(p)[-1].digest is not None:
                assert p in listed, p
    finally:
        s.close()


def test_names_below_a_directory_with_siblings_that_sort_inside_it(store: Store) -> None:
    """``a-b`` and ``a.d`` sort between ``a`` and ``a/`` in the index's keys; paths too
    long for an LMDB key are kept by hash: the listing finds each name once, all of them."""
    deep = "a/" + "q" * 250 + "/" + "r" * 250
    names = ["a", "a-b", "a/c", "a/c/d", "a.d/e", "a0", "a/z", "a-b/q", "a\x01x", "a/c-1/x", deep]
    journal(store, *(write(n, None, V1) for n in names))
    h = History(store)
    top = {b"a", b"a-b", b"a.d", b"a0", b"a\x01x"}
    assert h.children(b"") == h.children(b"", listed=True) == top
    assert h.children(b"a") == {b"c", b"z", b"c-1", b"q" * 250}
    assert h.children(b"a/c") == {b"d"} and h.children(b"a-b") == {b"q"}
    assert h.children(b"a/" + b"q" * 250) == {b"r" * 250}
    assert h.has_below(b"a/" + b"q" * 250) and not h.has_below(b"a/q")


@pytest.mark.parametrize("seed", range(200))
def test_a_paths_mode_at_a_point_is_what_the_whole_journal_says(tmp_path: Path, seed: int) -> None:
    """``History.mode_at`` (a restore's modes, from a path's rows) gives, at every point
    of a random journal and for every path, what ``changes.modes_at`` gives by reading
    every event: creates, writes, removals, chmods, renames of files and directories and
    exchanges."""
    import random

    from rwfs.core.changes import modes_at

    rnd = random.Random(seed)
    names = ["a", "b", "d/a", "d/b", "e/a", "t1", "d", "e"]
    s = Store(str(tmp_path / "journal"))
    try:
        for _ in range(rnd.randint(1, 25)):
            p, q, op = rnd.choice(names), rnd.choice(names), rnd.randrange(5)
            mode = rnd.choice([None, 0o600, 0o644, 0o755])
            if op == 0:
                ev = {**create(p), "mode": mode}
            elif op == 1:
                ev = {**write(p, rnd.choice([None, V1]), V2), "mode": mode}
            elif op == 2:
                ev = {**unlink(p, V1), "mode": mode}
            elif op == 3 and p != q:
                ev = {**rename(p, q, None, rnd.choice([None, V1])), "exchange": rnd.random() < 0.3}
            else:
                ev = {"op": "setattr", "path": p, "mode": mode}
            journal(s, ev)
        events, h = list(s.events()), History(s)
        for lsn in range(len(events) + 1):
            want = modes_at(events, lsn=lsn)
            assert {n: h.mode_at(n.encode(), lsn) for n in names} == {
                n: want.get(n.encode()) for n in names
            }, lsn
    finally:
        s.close()


def test_every_timeline_read_in_key_order_is_each_paths_own(store: Store) -> None:
    """``History.timelines()`` reads every path's versions in the index's key order, a
    thousand paths to a transaction; read a few at a time, across long paths' hashed
    keys too, it gives each path's own timeline, each once."""
    deep = "d/" + "x" * 300 + "/" + "y" * 300
    names = ["a", "a-b", "a/c", "b", deep, deep + "2", "e/f", "z"]
    for i, n in enumerate(names):
        journal(store, write(n, None, V1), write(n, V1, [V2, V3][i % 2]))
    journal(store, unlink("z", V2), rename("b", "b2", None, V3))
    h = History(store)
    want = dict(h.timelines([b""]))
    assert {p for p in want} == {os.fsencode(n) for n in [*names, "b2"]}
    assert dict(h.timelines()) == want
    with h._rows() as r:
        got: list[bytes] = []
        after: bytes | None = b""
        while after is not None:
            chunk, after = r.timelines(after, 2)
            assert len(chunk) <= 2
            got += [p for p, versions in chunk if versions == want[p]]
    assert sorted(got) == sorted(want)
