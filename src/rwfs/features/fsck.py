"""``rwfs fsck``: the journal and the object store checked against the tree.

Checks, each reported as one line of drift:
- every path the journal last recorded with a digest holds those bytes (a path that was
  never journaled, or that rwfs now writes unjournaled — passthrough, larger than
  ``max_journaled_bytes`` — is not checked, present or absent: rwfs makes no claim about
  it). A hard link that holds the bytes another of its names is journaled with is named
  as such: a write journaled under the name a later rename gave it, the drift a store
  written before links were journaled at their write's LSN may hold, which the next
  mount repairs (``recovery._repair_index``);
- every path it recorded as deleted is absent;
- no receipt is unsettled, no intent-log generation is unapplied and no intent record is
  held (else recovery is owed: mount once to run it), save an interrupted batch's owed writes, whose files must still
  hold their expected (or intended) bytes;
- every object the journal lists exists and holds the bytes its name says, and every object
  something refers to (the scratchpad, a chunk session, a handoff note, an open conflict's
  intended bytes) exists.

Modes: the full check (the default) hashes every journaled path and every listed object.
``--sample N`` hashes N of each picked at random; ``--changed`` hashes the objects and paths
whose ``lsn`` is past the journal's LSN at the start of the last completed full or
``--changed`` run (``meta`` ``b"fsck:lsn"``), so it cannot find rot of older objects, nor
bytes changed behind rwfs's back at a path the journal has not touched since. Both still
make every cheap check in full: receipts, held records, intent logs, and the presence of
every object the journal lists or something refers to.

Blocking: runs in the CLI process, against the raw tree (offline, or mounted through the
daemon's descriptors under /proc).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import beneath
from ..journal.objects import ObjectStore, digest_fd, open_regular
from ..journal.store import JournalUnavailable, Store
from ..policy import Policy, PolicyError

# The journal's LSN at the start of the last completed full or ``--changed`` run.
FSCK_LSN = b"fsck:lsn"
ZERO_DIGEST = "sha256:" + "0" * 64  # (a placeholder, never an object: not checked)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    mode: str = "full"  # "full", "sample" or "changed"
    since: int | None = None  # --changed: the recorded LSN it checked from
    fell_back: str | None = None  # --changed: why the full check ran instead
    paths: tuple[int, int] = (0, 0)  # (hashed or looked at, in the index)
    objects: tuple[int, int] = (0, 0)  # (hashed, listed)
    recorded: int | None = None  # the LSN recorded for the next --changed
    notes: list[str] = field(default_factory=list)


def fsck(
    root: str,
    state: str,
    progress: Callable[[str], None] | None = None,
    sample: int | None = None,
    changed: bool = False,
) -> Report:
    say = progress or (lambda m: None)
    report = Report(mode="sample" if sample else "changed" if changed else "full")
    problems = report.problems
    store = Store(os.path.join(state, "journal"))
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    state_fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # Read before any row: a row a later commit writes has a greater LSN, so the next
        # --changed run checks it even if this one did not see it.
        start = store.meta_int(b"lsn")
        since = _since(store, start, report) if changed else None
        interrupted = {b["name"] for b in store.batches() if b["state"] == "interrupted"}
        for r in store.unsettled():
            if r.get("batch") in interrupted:
                # An interrupted batch's owed write: recovery classified it; it waits for
                # resume or rollback, and the file must still hold its expected bytes.
                if _digest_at(root_fd, r["path"]) in (r["expected"], r["intended"]):
                    continue
                problems.append(
                    f"{r['path']}: owed by interrupted batch {r['batch']}, but holds neither "
                    "its expected nor its intended bytes: mount to record the conflict"
                )
                continue
            problems.append(
                f"receipt {r['id']} for {r['path']} is unsettled ({r['state']}): mount to recover it"
            )
        for h in store.records(b"held"):
            problems.append(
                f"intent record {h['id']} of generation {h['gen']} could not be journaled "
                f"({h['error']}): mount to retry it"
            )
        for name in os.listdir(os.path.join(state, "intents")):
            if name.endswith(".log") and os.path.getsize(os.path.join(state, "intents", name)):
                problems.append(f"intent log {name} is not applied: mount to recover it")
        policy = policy_of(state_fd)
        paths = store.paths()
        repaired = store.meta_int(b"index:links")  # (else the next mount repairs links)
        chosen = _choose(sorted(paths.items()), sample, since)
        report.paths = (len(chosen), len(paths))
        for n, (path, entry) in enumerate(chosen, 1):
            if n % 1000 == 0:
                say(f"fsck: {n}/{len(chosen)} paths")
            want = entry.get("digest")
            if policy.is_passthrough(path):
                # rwfs journals nothing of it, its removal neither: no claim to check (a
                # store from before a rename onto such a name dropped its rows).
                continue
            try:
                fd, st = open_regular(root_fd, path)
            except FileNotFoundError:
                if want is not None:
                    problems.append(f"{os.fsdecode(path)}: journaled as {want} but absent")
                continue
            except OSError:
                continue  # cannot be read: not a journaled file's content
            if fd < 0:
                continue  # a symlink or special file now (never opened): not checked
            try:
                if not _journaled(policy, path, st):
                    continue
                have, _ = digest_fd(fd)
            finally:
                os.close(fd)
            if want is None:
                continue  # deleted, then created again unjournaled
            if have != want:
                problem = f"{os.fsdecode(path)}: journaled as {want} but holds {have}"
                if st.st_nlink > 1 and (other := _link_holding(root_fd, paths, path, st, have)):
                    problem += (
                        f", the bytes its hard link {os.fsdecode(other)} is journaled with: "
                        "a write through that name was journaled under this one's later "
                        "name, before the rename that made it"
                        + ("; mount once to repair it" if not repaired else "")
                    )
                problems.append(problem)
        objects = ObjectStore(state_fd)
        for digest, what in _references(store):
            if not objects.exists(digest):
                problems.append(f"object {digest} is missing, though {what} needs it")
        listed = store.objects()
        chosen_objects = [d for d, _ in _choose(sorted(listed.items()), sample, since)]
        report.objects = (len(chosen_objects), len(listed))
        if report.mode != "full":
            # A lookup costs a stat, not a read: every listed object's presence is checked
            # whatever the mode.
            for n, digest in enumerate(sorted(listed), 1):
                if n % 1000 == 0:
                    say(f"fsck: {n}/{len(listed)} objects looked up")
                if digest != ZERO_DIGEST and not objects.exists(digest):
                    problems.append(f"object {digest} is listed in the journal but missing")
        for n, digest in enumerate(chosen_objects, 1):
            if n % 1000 == 0:
                say(f"fsck: {n}/{len(chosen_objects)} objects")
            if digest == ZERO_DIGEST:
                continue
            try:
                fd = objects.open(digest)
            except FileNotFoundError:
                if report.mode == "full":  # (else reported by the lookups above)
                    problems.append(f"object {digest} is listed in the journal but missing")
                continue
            try:
                have, _ = digest_fd(fd)
            finally:
                os.close(fd)
            if have != digest:
                problems.append(f"object {digest} is damaged: it holds {have}")
        if report.mode != "sample":
            # Recorded whatever the run found: it looked at everything up to ``start``. A
            # sample looked at too little to stand for a run.
            try:
                store.write(lambda txn: txn.set_meta_int(FSCK_LSN, start))
                report.recorded = start
            except JournalUnavailable as exc:
                report.notes.append(
                    f"fsck: this run could not be recorded ({exc}): the next --changed "
                    "checks from the run before"
                )
    finally:
        os.close(root_fd)
        os.close(state_fd)
        store.close()
    return report


def _since(store: Store, start: int, report: Report) -> int | None:
    """The LSN --changed checks from, or None (then the full check runs, and says why)."""
    last = store.meta_int(FSCK_LSN)
    if last == 0:
        report.fell_back = "no completed fsck run is recorded"
    elif last > start:
        # A journal older than the run recorded in it (put back from a copy): the rows'
        # LSNs cannot be trusted to be newer than what that run saw.
        report.fell_back = f"the recorded run (LSN {last}) is past the journal's end (LSN {start})"
    if report.fell_back:
        report.mode = "full"
        return None
    report.since = last
    return last


def _choose(
    rows: list[tuple[Any, dict[str, Any]]], sample: int | None, since: int | None
) -> list[tuple[Any, dict[str, Any]]]:
    """The rows to check: all, ``sample`` of them at random, or those journaled after
    ``since`` (a row without an LSN counts as new)."""
    if sample:
        return sorted(random.sample(rows, min(sample, len(rows))), key=lambda r: r[0])
    if since is not None:
        return [r for r in rows if not isinstance(r[1].get("lsn"), int) or r[1]["lsn"] > since]
    return rows


def policy_of(state_fd: int) -> Policy:
    try:
        with open(os.open(b"policy.toml", os.O_RDONLY, dir_fd=state_fd), "rb") as f:
            return Policy.parse(f.read().decode("utf-8", "replace"))
    except (OSError, PolicyError):
        return Policy()


def _journaled(policy: Policy, path: bytes, st: os.stat_result) -> bool:
    """Files rwfs writes unjournaled (passthrough, too large) are not checked."""
    return not policy.is_passthrough(path) and st.st_size <= policy.max_journaled_bytes


def main_fsck(root: str, state: str, sample: int | None = None, changed: bool = False) -> int:
    from ..progress import Progress

    bar = Progress()
    try:
        report = fsck(root, state, progress=bar, sample=sample, changed=changed)
    finally:
        bar.done()
    for p in report.problems:
        print(p)
    print(summary(report), file=sys.stderr)  # (stdout: one line a problem, nothing else)
    for note in report.notes:
        print(note, file=sys.stderr)
    if report.problems:
        print(f"fsck: {len(report.problems)} problem(s)", file=sys.stderr)
        return 1
    print("fsck: the journal, the object store and the tree agree")
    return 0


def summary(report: Report) -> str:
    """Which check ran and how much of the store it read, in one line."""
    (p, pn), (o, on) = report.paths, report.objects
    counts = f"checked {p} of {pn} paths and {o} of {on} objects"
    if report.mode == "sample":
        return (
            f"fsck: {counts}, a sample (every object looked up; run without --sample to check all)"
        )
    if report.mode == "changed":
        return (
            f"fsck: changed since LSN {report.since}: {counts}, those journaled since "
            "(every object looked up; older ones are not read again: run without --changed "
            "to check all)"
        )
    why = f" ({report.fell_back}, so --changed checked all)" if report.fell_back else ""
    return f"fsck: full check{why}: {counts}"


def _link_holding(
    root_fd: int, paths: dict[bytes, dict], path: bytes, st: os.stat_result, digest: str
) -> bytes | None:
    """Another name of the file ``st`` at ``path`` that the index gives ``digest``."""
    for other, entry in paths.items():
        if other == path or entry.get("digest") != digest:
            continue
        try:
            got = beneath.stat(root_fd, other)
        except OSError:
            continue
        if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino):
            return other
    return None


def _digest_at(root_fd: int, path: str) -> str | None:
    try:
        fd, _ = open_regular(root_fd, path)
    except OSError:
        return None
    if fd < 0:
        return None
    try:
        return digest_fd(fd)[0]
    finally:
        os.close(fd)


def _references(store: Store) -> list[tuple[str, str]]:
    refs = [(r["digest"], f"scratch file {r['name']}") for r in store.records(b"scratch")]
    for session in store.records(b"chunks"):
        refs += [
            (d, f"chunk {p} of session {session['name']}") for p, d in session["parts"].items()
        ]
    refs += [(h["note"], f"handoff note {h['id']}") for h in store.records(b"handoffs")]
    refs += [
        (c["intended"], f"conflict {c['id']}")
        for c in store.conflicts()
        if c["state"] == "open" and c.get("intended")
    ]
    return refs
