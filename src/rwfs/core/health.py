"""Whether the journal commits, and the errors a writer gets while it does not (SPEC
§7.2, ``.rw/status``)."""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..journal.store import now_iso
from .errors import RwfsError
from .syscalls import fsdecode

if TYPE_CHECKING:
    from .workspace import Workspace

log = logging.getLogger("rwfs.commit")
# While the journal cannot commit, the committer tries again after a delay that starts here
# and doubles up to RETRY_MAX (seconds); a sync, an fsync or an unmount tries at once.
RETRY_MIN = 0.1
RETRY_MAX = 3.2


@dataclass
class JournalState:
    """Whether the journal commits, and since when it does not (``.rw/status``)."""

    failing_since: str | None = None  # when the first of the failed attempts ran
    last_error: str | None = None
    last_failure: str | None = None  # when the latest failed attempt ran
    failed_attempts: int = 0  # since failing_since
    retry_in: float = RETRY_MIN  # the committer's delay before its next attempt

    @property
    def ok(self) -> bool:
        return self.failing_since is None


class JournalHealth:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.state = JournalState()

    @property
    def ok(self) -> bool:
        return self.state.ok

    def status(self) -> dict[str, Any]:
        """The journal's side of ``.rw/status``."""
        j = self.state
        return {
            "ok": j.ok,
            "failing_since": j.failing_since,
            "last_error": j.last_error,
            "last_failure": j.last_failure,
            "failed_attempts": j.failed_attempts,
            "queued_commits": self.ws.committer.owed_commits(),
            "next_retry_s": None if j.ok else j.retry_in,
        }

    def refusal(self, path: bytes) -> RwfsError:
        """A new commit refused because the journal cannot commit (SPEC §7.2)."""
        j, n = self.state, self.ws.committer.owed_commits()
        return RwfsError(
            errno.EIO,
            "journal_unavailable",
            "journal",
            f"The journal cannot commit since {j.failing_since} ({j.last_error}), so rwfs "
            "refused this commit: nothing was written and the file keeps its previous "
            f"bytes; {n} earlier commits are queued and rwfs keeps retrying them. Free space "
            "on the filesystem that holds WORKSPACE/.rw/journal (or fix the device), wait "
            "until .rw/status shows the journal ok, then write the file again.",
            path=fsdecode(path),
            suggested_action="free disk space for .rw/journal, then write the file again",
            details={"failing_since": j.failing_since, "last_error": j.last_error, "queued": n},
        )

    def still_queued(self, path: bytes) -> RwfsError:
        """A writer that waits for durability (fsync, strict close, sync) of commits the
        journal cannot take now: they stay queued and are not lost (SPEC §7.2)."""
        j, n = self.state, self.ws.committer.owed_commits()
        what = (
            "this file's commit is not durable yet: it stays queued (the intent log keeps "
            "it), the mount shows its new bytes and the tree still holds the previous ones"
            if path
            else f"the {n} commits queued are not durable yet: they stay queued (the intent "
            "log keeps them) and the mount shows their new bytes"
        )
        return RwfsError(
            errno.EIO,
            "journal_unavailable",
            "journal",
            f"The journal cannot commit since {j.failing_since} ({j.last_error}), so {what}; "
            "rwfs commits them when the journal can write again, or the next mount does. "
            "Free space on the filesystem that holds WORKSPACE/.rw/journal (or fix the "
            "device), then fsync again or write sync to .rw/ctl to confirm.",
            path=fsdecode(path),
            suggested_action="free disk space for .rw/journal, then write sync to .rw/ctl",
            details={"failing_since": j.failing_since, "last_error": j.last_error, "queued": n},
        )

    def probe(self) -> None:
        self.ws.store.write(lambda txn: txn.set_meta_int(b"probe", 1))

    def failed(self, why: str) -> None:
        j = self.state
        j.last_failure = now_iso()
        j.last_error = why
        j.failed_attempts += 1
        if j.failing_since is None:
            j.failing_since, j.retry_in = j.last_failure, RETRY_MIN
            log.error(
                "the journal cannot commit: %s (%d commits queued)",
                why,
                self.ws.committer.owed_commits(),
            )
        else:
            j.retry_in = min(j.retry_in * 2, RETRY_MAX)
            if j.failed_attempts % 20 == 0:
                log.error(
                    "the journal still cannot commit after %d attempts since %s: %s",
                    j.failed_attempts,
                    j.failing_since,
                    why,
                )

    def back(self) -> None:
        j = self.state
        if j.failing_since is None:
            return
        log.warning(
            "the journal commits again (it failed %d times since %s: %s)",
            j.failed_attempts,
            j.failing_since,
            j.last_error,
        )
        self.state = JournalState()
