"""The verbs that act through a mount's control files: ``batch``, ``conflicts``, ``undo``,
``snapshot``, ``restore``, ``allow`` and ``gc``."""

from __future__ import annotations

import argparse
import json
import os
import shlex

from .mount import (
    QuietError,
    attempt,
    locate,
    write_verb,
)
from .where import (
    control_file,
    in_workspace,
    live_mount,
    made_batch,
    mount_of,
    print_listing,
    read_text,
    workspace_arg,
)


def cmd_batch(a: argparse.Namespace) -> int:
    from ..journal.store import plain_name

    if a.name is None and a.action != "status":
        raise QuietError(f"rwfs batch {a.action} needs a batch name: rwfs batch {a.action} NAME", 2)
    if a.name is not None and (
        plain_name(os.fsencode(a.name)) is None or a.name.startswith("auto-")
    ):
        raise QuietError(
            f"{a.name!r} is not a batch name: use 1 to 64 letters, digits, dots, dashes or "
            "underscores, not starting with a dash or 'auto-'",
            2,
        )
    mount = mount_of(a.directory or ".")
    if a.action == "status" and a.name is None:
        top = control_file(mount, "batches")
        names = sorted(os.listdir(top))
        for name in names:
            st = json.loads(read_text(os.path.join(top, name, "status")))
            if a.json:
                print(json.dumps(st))
            else:
                print(f"{name}\t{st['state']}\t{len(st['paths'])} paths")
        if not names and not a.json:
            print("rwfs: no batches")
        return 0
    where = control_file(mount, "batches", a.name)
    if a.action == "begin":
        if os.path.exists(where):
            raise QuietError(f"batch {a.name} exists already: the name is taken")
        attempt(mount, lambda: os.mkdir(where))
        if a.scope:
            write_verb(mount, os.path.join(where, "ctl"), f"scope {a.scope}")
        print(f"rwfs: batch {a.name} is open: writes are held until 'rwfs batch commit {a.name}'")
    elif a.action in ("status", "diff"):
        try:
            print(read_text(os.path.join(where, a.action)), end="")
        except FileNotFoundError:
            raise QuietError(f"there is no batch {a.name}") from None
    else:
        if not os.path.isdir(where):
            raise QuietError(f"there is no batch {a.name}")
        write_verb(mount, os.path.join(where, "ctl"), a.action)
        state = json.loads(read_text(os.path.join(where, "status")))["state"]
        print(f"rwfs: batch {a.name} is {state}")
    return 0


def cmd_conflicts(a: argparse.Namespace) -> int:
    mount = mount_of(a.directory or ".")
    top = control_file(mount, "conflicts")
    if a.action is None:
        infos = [
            json.loads(read_text(os.path.join(top, cid, "info")))
            for cid in sorted(os.listdir(top), key=int)
        ]
        return print_listing(
            infos, a.json, "no open conflicts", "{id}\t{path}\tbatch {batch}\t{reason}"
        )
    if a.id is None or (a.action == "resolve") != (a.how is not None):
        raise QuietError(
            "use: rwfs conflicts [show ID | resolve ID keep-actual|take-intended|resolved]", 2
        )
    where = os.path.join(top, a.id)
    if not os.path.isdir(where):
        raise QuietError(f"there is no open conflict {a.id}")
    if a.action == "show":
        print(read_text(os.path.join(where, "info")), end="")
        print(read_text(os.path.join(where, "merged")), end="")
        return 0
    write_verb(mount, os.path.join(where, "ctl"), a.how)
    print(f"rwfs: conflict {a.id} resolved ({a.how})")
    return 0


def cmd_undo(a: argparse.Namespace) -> int:
    mount = mount_of(a.directory or ".")
    made = made_batch(mount, f"undo {a.batch}")
    how = f"the undo is batch {made}: undo it to redo" if made else "see 'rwfs batch status'"
    print(f"rwfs: {a.batch} undone ({how})")
    return 0


def cmd_snapshot(a: argparse.Namespace) -> int:
    from ..journal.store import plain_name

    if a.name is not None and plain_name(os.fsencode(a.name)) is None:
        raise QuietError(
            f"{a.name!r} is not a snapshot name: use 1 to 64 letters, digits, dots, dashes or "
            "underscores, not starting with a dash",
            2,
        )
    mount = mount_of(a.directory or ".")
    top = control_file(mount, "snapshots")
    if a.name is None:
        from ..journal.store import Store

        _, state, _ = locate(mount)
        if os.access(state, os.R_OK | os.X_OK):  # one read of the journal's records
            store = Store(os.path.join(state, "journal"))
            try:
                snaps = sorted(store.snapshots(), key=lambda s: str(s["name"]))
            finally:
                store.close()
        else:  # (another user than the daemon's: through the mount, an info file each)
            names = sorted(os.listdir(top))
            snaps = [json.loads(read_text(os.path.join(top, n, "info"))) for n in names]
        for info in snaps:
            print(f"{info['name']}\t{info['ts']}\tlsn {info['lsn']}")
        return 0
    if os.path.exists(os.path.join(top, a.name)):
        raise QuietError(f"snapshot {a.name} exists already: choose another name")
    attempt(mount, lambda: os.mkdir(os.path.join(top, a.name)))
    print(f"rwfs: snapshot {a.name}: see {os.path.join(top, a.name, 'tree')}")
    return 0


def cmd_restore(a: argparse.Namespace) -> int:
    mount = mount_of(a.directory or ".")
    base = os.path.realpath(mount)
    paths = []
    for p in a.paths:
        full = os.path.realpath(p)
        paths.append(os.path.relpath(full, base) if full.startswith(base + os.sep) else p)
    # Quoted as a shell would: a path may hold blanks, newlines, quotes, any bytes.
    made = made_batch(mount, " ".join(["restore", a.name, *map(shlex.quote, paths)]))
    how = f" (batch {made}: undo it to go back)" if made else ""
    print(f"rwfs: restored {', '.join(paths) or 'the workspace'} to snapshot {a.name}{how}")
    return 0


def cmd_allow(a: argparse.Namespace) -> int:
    from ..checks.allowances import ALLOW_S, WAIVES

    # The workspace: -C DIR's, else the current directory's, else the first PATH's (the
    # absolute path a refusal names works from anywhere).
    starts = (
        [a.directory]
        if a.directory
        else [".", *(os.path.dirname(os.path.abspath(p)) for p in a.paths[:1])]
    )
    mount = live_mount(starts)
    if not a.paths:
        if a.cancel:
            raise QuietError("rwfs allow --cancel needs the paths to cancel", 2)
        try:
            listed = json.loads(read_text(control_file(mount, "allowed")))["allowed"]
        except PermissionError:
            raise QuietError(
                "only the workspace's owner (or root) may list the allowances (.rw/allowed)"
            ) from None
        return print_listing(listed, a.json, "no allowances", "{path}\tuid {uid}\tuntil {expires}")
    from .run import mount_workspace

    tops = [mount] + [w for w in (mount_workspace(mount),) if w and w != mount]
    names = [in_workspace(p, tops) for p in a.paths]
    # Quoted as a shell would (a path may hold any bytes); "./-x", not an option.
    words = [shlex.quote("./" + n if n.startswith("-") else n) for n in names]
    write_verb(
        mount,
        control_file(mount, "ctl"),
        " ".join(["allow", *(["--cancel"] if a.cancel else []), *words]),
    )
    shown = ", ".join(names)
    if a.cancel:
        print(f"rwfs: cancelled the allowance of {shown}: the gates judge its next write again")
    else:
        print(
            f"rwfs: allowed {shown}: your next write of it (within {ALLOW_S / 60:.0f} minutes) "
            f"is not refused by the {', '.join(WAIVES[:-2])} or {WAIVES[-2]} gates (the secrets "
            "gate still judges it); "
            "the journal records it as allowed. Write it now; "
            f"'rwfs allow --cancel PATH' takes this back"
        )
    return 0


def cmd_gc(a: argparse.Namespace) -> int:
    from ..features.fsck import policy_of
    from ..features.gc import collect
    from ..journal.objects import ObjectStore
    from ..journal.store import Store

    ws, mount_point = workspace_arg(a)
    if mount_point is not None:
        mount = mount_point
        write_verb(mount, control_file(mount, "ctl"), "gc")
        with open(control_file(mount, "journal")) as f:
            done = [json.loads(line) for line in f if '"op": "gc"' in line][-1]
    else:
        root, state, _ = locate(ws)
        from ..progress import Progress

        bar = Progress()
        store = Store(os.path.join(state, "journal"))
        state_fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            done = collect(
                store,
                ObjectStore(state_fd),
                policy_of(state_fd),
                progress=bar,
                root_fd=root_fd,  # measured for retain_ratio
            )
        finally:
            bar.done()
            os.close(root_fd)
            os.close(state_fd)
            store.close()
    print(f"gc: removed {done['removed']} objects, freed {done['freed_bytes']} bytes")
    return 0
