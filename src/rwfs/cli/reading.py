"""``rwfs log`` and ``rwfs fsck``: the journal read, through the mount when it is mounted."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from .mount import (
    locate,
)
from .where import (
    located,
    relative_path,
    workspace_arg,
)


def cmd_log(a: argparse.Namespace) -> int:
    import collections
    import time

    from ..journal.store import Store

    ws, mount = workspace_arg(a)
    root, state, _ = locate(mount or ws)
    path = relative_path(a, ws, mount)
    # The daemon's descriptors are for its own user and root: the workspace owner of a
    # root daemon reads the journal through the mount.
    readable = mount is None or os.access(state, os.R_OK | os.X_OK)
    store: Any = Store(os.path.join(state, "journal")) if readable else _MountJournal(mount)

    def wanted(ev: dict[str, Any]) -> bool:
        if path is None or path == ".":
            return True
        return any(
            p == path or str(p).startswith(path + "/")
            for p in (ev.get("path"), ev.get("dest"))
            if p
        )

    shown = 0
    try:
        events: Iterator[dict[str, Any]]
        if a.last is not None and isinstance(store, Store):
            events = iter(store.newest(a.last, a.since, wanted))  # read back from the end
        else:
            events = (ev for ev in store.events(since=a.since) if wanted(ev))
            if a.last is not None:
                events = iter(collections.deque(events, maxlen=a.last))
        last = a.since
        for ev in events:
            _print_event(ev, a.json)
            shown += 1
            last = max(last, int(ev.get("lsn", last)))
        if a.follow:
            sys.stdout.flush()
            while True:
                time.sleep(0.2)
                if mount is not None and not os.path.exists(state):
                    print("rwfs: the workspace was unmounted", file=sys.stderr)
                    return 0
                for ev in store.events(since=last):
                    last = int(ev["lsn"])
                    if wanted(ev):
                        _print_event(ev, a.json)
                sys.stdout.flush()
    finally:
        store.close()
    if not shown and path is not None and not a.json:
        print(f"rwfs: no journal events for {path}", file=sys.stderr)
    return 0


class _MountJournal:
    """``Store.events`` read from a mount's ``.rw/journal`` (JSON lines)."""

    def __init__(self, mount: str | None) -> None:
        self.file = os.path.join(mount or ".", ".rw", "journal")

    def events(self, since: int = 0) -> Iterator[dict[str, Any]]:
        with open(self.file, "rb") as f:
            for line in f:
                ev = json.loads(line)
                if int(ev.get("lsn", 0)) > since:
                    yield ev

    def close(self) -> None:
        pass


def _print_event(ev: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(ev))
        return
    digests = ""
    if ev.get("expected") or ev.get("intended"):
        digests = f" {short(ev.get('expected'))} -> {short(ev.get('intended'))}"
    dest = f" -> {ev['dest']}" if ev.get("dest") else ""
    who = f" ({ev['comm']})" if ev.get("comm") else ""
    sess = f" [{ev['session']}]" if ev.get("session") else ""
    lsn, ts, op = ev.get("lsn", "?"), ev.get("ts", "?"), ev.get("op", "?")
    print(f"{lsn:>6} {ts} {op:<8} {ev.get('path') or ''}{dest}{digests}{who}{sess}")


def short(d: Any) -> str:
    """A digest cut short for the log; any other value as it is (an event written by an
    older rwfs may hold something else)."""
    if not d:
        return "null"
    return str(d).rpartition(":")[2][:12]


def cmd_fsck(a: argparse.Namespace) -> int:
    from ..features.fsck import main_fsck

    root, state, _ = located(a)
    return main_fsck(root, state, sample=a.sample, changed=a.changed)
