"""The commit decision (``core/decision.py``) as a table: every combination of the facts
of a sealed stage, and what each must become (SPEC §3.2, §4, §6.1, §6.4)."""

from __future__ import annotations

import itertools

import pytest

from rwfs.core.decision import Decision, Facts, Kind, decide

A, B, C = "sha256:a", "sha256:b", "sha256:c"

# (intended, expected, held) -> the answer from the seal's facts alone.
SEALED = [
    (A, A, None, Kind.NOOP),  # the bytes it was built on
    (A, B, None, Kind.JUDGE),
    (A, None, None, Kind.JUDGE),  # a new file (built on nothing)
    (A, B, A, Kind.DRAFT_AGAIN),  # the batch's draft again
    (A, A, B, Kind.BASE_AGAIN),  # the batch's base again: nothing left to hold
    (A, B, C, Kind.JUDGE),  # a new draft of a held file
    (A, A, A, Kind.BASE_AGAIN),  # (a draft equal to its base: no change left either)
]


@pytest.mark.parametrize("intended,expected,held,kind", SEALED)
def test_what_the_seal_settles(intended: str, expected: str, held: str, kind: Kind) -> None:
    assert decide(Facts(intended, expected, held)) == Decision(kind)


# (rejected, stale, stale_write, in_batch) -> the answer once judged, for a change.
JUDGED = [
    (True, None, "warn", False, Decision(Kind.REFUSE)),
    (True, A, "conflict", False, Decision(Kind.REFUSE)),  # refused first: nothing is lost
    (True, None, "warn", True, Decision(Kind.REFUSE)),  # a batch holds no refused draft
    (False, None, "warn", False, Decision(Kind.SUBMIT)),
    (False, None, "warn", True, Decision(Kind.HOLD)),
    (False, None, "conflict", False, Decision(Kind.SUBMIT)),
    (False, A, "warn", False, Decision(Kind.SUBMIT, stale_warning=True)),
    (False, "", "warn", False, Decision(Kind.SUBMIT, stale_warning=True)),  # read unknown
    (False, A, "warn", True, Decision(Kind.HOLD, stale_warning=True)),
    (False, A, "conflict", False, Decision(Kind.CONFLICT)),
    (False, "", "conflict", False, Decision(Kind.CONFLICT)),
    (False, A, "conflict", True, Decision(Kind.CONFLICT)),  # in a batch as well
    (False, A, "off", False, Decision(Kind.SUBMIT)),  # off: never a stale write
    (False, A, "off", True, Decision(Kind.HOLD)),
]


@pytest.mark.parametrize("rejected,stale,stale_write,in_batch,want", JUDGED)
def test_what_a_judged_change_becomes(
    rejected: bool, stale: str | None, stale_write: str, in_batch: bool, want: Decision
) -> None:
    for intended, expected, held in ((A, B, None), (A, None, None), (A, B, C)):
        f = Facts(intended, expected, held, rejected, stale, stale_write, in_batch)
        assert decide(f) == want, f


def test_every_combination_answers_as_the_rules_say() -> None:
    """Over every combination: an unchanged write is never judged; a change is judged
    before anything else; a refused one is never committed or held; a conflict only
    under its policy; a stale warning only on a commit of a stale read."""
    digests = (A, B, None)
    for intended, expected, held, rejected, stale, policy, in_batch in itertools.product(
        (A, B),
        digests,
        digests,
        (None, True, False),
        (None, "", A),
        ("off", "warn", "conflict"),
        (False, True),
    ):
        f = Facts(str(intended), expected, held, rejected, stale, policy, in_batch)
        d = decide(f)
        unchanged = intended in (expected, held)
        assert (d.kind in (Kind.NOOP, Kind.DRAFT_AGAIN, Kind.BASE_AGAIN)) == unchanged, f
        if unchanged:
            continue
        if rejected is None:
            assert d == Decision(Kind.JUDGE), f
        elif rejected:
            assert d == Decision(Kind.REFUSE), f
        else:
            lost = stale is not None and policy != "off"
            assert (d.kind == Kind.CONFLICT) == (lost and policy == "conflict"), f
            assert d.stale_warning == (lost and policy == "warn"), f
            if d.kind != Kind.CONFLICT:
                assert d.kind == (Kind.HOLD if in_batch else Kind.SUBMIT), f
