"""Task-continuity handoff (SPEC §8, the paper's L5): ``.rw/handoff``.

Writing a Markdown note there stores it (an object and an LMDB record) with a front matter
whose ``last_good_state`` lists the path and digest of each file committed since the
previous handoff, from the journal. Reading it returns the newest note with that front
matter plus a drift check: every listed file whose bytes have changed since is named in
``drift`` (warnings, not errors: a file may have been changed on purpose). Earlier notes
are kept under ``.rw/handoffs/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
import yaml

from ..core.syscalls import WORKERS

if TYPE_CHECKING:
    from .nodes import CDir
    from .tree import Control

_DB = b"handoffs"
EMPTY = (
    b"# No handoff yet\n\nWrite a Markdown note to this file (what is done, what is next);\n"
    b"rwfs adds the files committed since the last note and checks them for drift on read.\n"
)


def install(control: Control) -> None:
    h = Handoff(control)
    node = control.add(control.root, b"handoff", h.render, h.write)
    node.slow = node.settle = True  # the drift check reads the files as committed
    top = control.mkdir(control.root, b"handoffs")
    top.refresh = lambda: h.refresh_archive(top)


def split(text: str) -> tuple[dict[str, Any], str]:
    """A note's own front matter (a YAML mapping between --- lines) and its body."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end > 0:
            try:
                meta = yaml.safe_load(text[4:end])
            except yaml.YAMLError:
                meta = None
            if isinstance(meta, dict):
                return meta, text[end + 5 :]
    return {}, text


class Handoff:
    def __init__(self, control: Control) -> None:
        self.c = control

    def _all(self) -> list[dict[str, Any]]:
        return sorted(self.c.ws.store.records(_DB), key=lambda r: r["id"])

    async def write(self, data: bytes, who: dict[str, Any]) -> None:
        ws = self.c.ws
        await ws.committer.sync()  # the state named below includes every acknowledged write
        previous = self._all()
        since = previous[-1]["lsn"] if previous else 0
        state: dict[str, str | None] = {}
        for ev in ws.store.events(since=since):
            if ev["op"] in ("write", "create", "resolve") and ev.get("intended"):
                state[ev["path"]] = ev["intended"]
            elif ev["op"] == "unlink":
                state[ev["path"]] = None
            elif ev["op"] == "rename" and ev.get("intended"):
                state.pop(ev["path"], None)
                state[ev["dest"]] = ev["intended"]
        good = [{"path": p, "sha256": d} for p, d in sorted(state.items()) if d]

        def keep() -> None:
            digest = ws.objects.keep_bytes(data)
            record = {"lsn": ws.store.meta_int(b"lsn"), "note": digest, "last_good_state": good}
            ws.store.write(lambda txn: txn.new_handoff({**record, **who}))

        async with ws.committer.exclusive():  # the object and its record, together, for gc
            await trio.to_thread.run_sync(keep, limiter=WORKERS)

    def _text(self, record: dict[str, Any], drift: bool) -> bytes:
        ws = self.c.ws
        meta, body = split(ws.objects.read(record["note"]).decode("utf-8", "replace"))
        meta = {**meta, "written": record["ts"], "last_good_state": record["last_good_state"]}
        warnings = []
        if drift:
            for entry in record["last_good_state"]:
                try:
                    now = ws.digests.live(os.fsencode(entry["path"]))[0]
                except OSError:  # unreadable now, or past max_journaled_bytes (not hashed)
                    now = None
                if now != entry["sha256"]:
                    warnings.append(
                        {"path": entry["path"], "recorded": entry["sha256"], "now": now}
                    )
            meta["drift"] = warnings
        head = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
        tail = "".join(
            f"\n> drift: {w['path']} has changed since this note was written"
            + (" (it is gone)" if w["now"] is None else "")
            for w in warnings
        )
        return f"---\n{head}---\n{body}{tail}{chr(10) if tail else ''}".encode()

    def render(self) -> bytes:
        records = self._all()
        return self._text(records[-1], drift=True) if records else EMPTY

    def refresh_archive(self, top: CDir) -> None:
        for record in self._all()[:-1]:
            name = f"{record['id']:04d}-{record['ts'][:19]}Z.md".encode()
            if name not in top.children:
                self.c.add(top, name, self._archived(record)).slow = True

    def _archived(self, record: dict[str, Any]) -> Callable[[], bytes]:
        return lambda: self._text(record, drift=False)
