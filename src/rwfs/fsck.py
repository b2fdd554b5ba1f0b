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

Blocking: runs in the CLI process, against the raw tree (offline, or mounted through the
daemon's descriptors under /proc).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from . import beneath
from .objects import ObjectStore, digest_fd, open_regular
from .policy import Policy, PolicyError
from .store import Store


def fsck(root: str, state: str, progress: Callable[[str], None] | None = None) -> list[str]:
    say = progress or (lambda m: None)
    problems: list[str] = []
    store = Store(os.path.join(state, "journal"))
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    state_fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    try:
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
        for n, (path, entry) in enumerate(sorted(paths.items()), 1):
            if n % 1000 == 0:
                say(f"fsck: {n}/{len(paths)} paths")
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
        for n, digest in enumerate(sorted(listed), 1):
            if n % 1000 == 0:
                say(f"fsck: {n}/{len(listed)} objects")
            if digest == "sha256:" + "0" * 64:
                continue
            try:
                fd = objects.open(digest)
            except FileNotFoundError:
                problems.append(f"object {digest} is listed in the journal but missing")
                continue
            try:
                have, _ = digest_fd(fd)
            finally:
                os.close(fd)
            if have != digest:
                problems.append(f"object {digest} is damaged: it holds {have}")
    finally:
        os.close(root_fd)
        os.close(state_fd)
        store.close()
    return problems


def policy_of(state_fd: int) -> Policy:
    try:
        with open(os.open(b"policy.toml", os.O_RDONLY, dir_fd=state_fd), "rb") as f:
            return Policy.parse(f.read().decode("utf-8", "replace"))
    except (OSError, PolicyError):
        return Policy()


def _journaled(policy: Policy, path: bytes, st: os.stat_result) -> bool:
    """Files rwfs writes unjournaled (passthrough, too large) are not checked."""
    return not policy.is_passthrough(path) and st.st_size <= policy.max_journaled_bytes


def main_fsck(root: str, state: str) -> int:
    from .progress import Progress

    bar = Progress()
    try:
        problems = fsck(root, state, progress=bar)
    finally:
        bar.done()
    for p in problems:
        print(p)
    if problems:
        print(f"fsck: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("fsck: the journal, the object store and the tree agree")
    return 0


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
