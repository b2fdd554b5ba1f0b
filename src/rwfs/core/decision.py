"""The commit decision (SPEC §3.2): what a sealed stage becomes at its commit point.

A pure function of the facts: ``commitpoint.CommitPoint.run`` gathers them and carries the
decision out (``docs/architecture.md``, "The commit decision"). It is asked twice: first
with what the seal tells (the digests and the draft a batch holds), which settles an
unchanged write; then, if it answered ``JUDGE``, with the gates' findings, the stale read
and the batch as well. The second facts are gathered only then: gathering them uses up
the writer's allowance and may hash a replaced file.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    DRAFT_AGAIN = "draft_again"  # the batch's draft again: the stage goes, the draft stays
    BASE_AGAIN = "base_again"  # the batch's base again: no change left, the batch lets go
    NOOP = "noop"  # the bytes it was built on: nothing to commit, a noop event
    JUDGE = "judge"  # a change: ask again with the findings, the stale read and the batch
    REFUSE = "refuse"  # a gate refused it: the file reads as before, the draft is kept
    CONFLICT = "conflict"  # a lost update under stale_write = "conflict": ESTALE
    HOLD = "hold"  # an open batch takes it as its draft (committed alone if it closed)
    SUBMIT = "submit"  # to the group committer


@dataclass(frozen=True)
class Facts:
    intended: str  # the sealed bytes' digest
    expected: str | None  # the digest of the bytes the stage was built on
    held: str | None = None  # the digest of the draft an open batch holds of the file
    # Known once judged (``None``: not gathered yet):
    rejected: bool | None = None  # a gate finding, after the allowance, refuses it
    stale: str | None = None  # what the writer read, if another process changed the file
    # since ("" if no longer known); None if not stale or stale writes are off
    stale_write: str = "warn"  # the policy: "off", "warn" or "conflict"
    in_batch: bool = False  # an open batch takes the change (it holds the file, or the
    # writer is in its scope)


@dataclass(frozen=True)
class Decision:
    kind: Kind
    stale_warning: bool = False  # the commit carries a stale_write warning


def decide(f: Facts) -> Decision:
    if f.held is not None and f.intended == f.expected:
        return Decision(Kind.BASE_AGAIN)
    if f.held is not None and f.intended == f.held:
        return Decision(Kind.DRAFT_AGAIN)
    if f.intended == f.expected:
        return Decision(Kind.NOOP)
    if f.rejected is None:
        return Decision(Kind.JUDGE)
    if f.rejected:
        return Decision(Kind.REFUSE)
    stale = f.stale is not None and f.stale_write != "off"
    if stale and f.stale_write == "conflict":
        return Decision(Kind.CONFLICT)
    return Decision(Kind.HOLD if f.in_batch else Kind.SUBMIT, stale_warning=stale)
