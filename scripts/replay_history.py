"""Gates over real version history: every edit of a project's history, replayed through
``rwfs.checks.gates.check`` as a commit makes it, and the edits refused counted.

Every edit a project's maintainers committed is a legitimate one, so every refusal here is
a false refusal (a bad edit that reached a project's history is rare, and --show lets each
refusal be read). For each commit of a repository's first-parent history (the last N with
``--commits N``), oldest first, each file the commit modified (not added, removed or
renamed; a regular file; text: the old bytes hold no NUL, as the gates decide; under
``gates.MAX_GATED_BYTES``) of a kind the gates know (a format the syntax gate parses, or
the docs of reST, Markdown and plain text) is judged: the gates get the path, the blob
before the commit, the blob after it and the default policy, as a commit through a mount
gives them. Blobs are read with one ``git cat-file --batch``. Oldest first, each path's
previous version is the one judged before, so the parsers' kept parse serves as in an
edit session.

    scripts/replay_history.py [--commits N] [--show] [--json] [NAME=]REPO...

REPO is a git repository (a bare clone is enough); NAME, the project's name in the table
(the directory's name by default). Also run as ``scripts/bench replay REPO...``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rwfs.checks import gates, parsers
from rwfs.policy import Policy

# Docs the gates judge as text (truncation, elision), beside the formats they parse.
DOC_KINDS = {".rst": "rest", ".md": "markdown", ".markdown": "markdown", ".txt": "text"}
REGULAR = (b"100644", b"100755")


def kind(path: bytes) -> str | None:
    """The kind of file a path names (None: not one the gates know)."""
    lang = parsers.language(path)
    if lang is not None:
        return "typescript" if lang == "tsx" else lang
    name = path.rsplit(b"/", 1)[-1].decode("utf-8", "replace").lower()
    dot = name.rfind(".")
    return DOC_KINDS.get(name[dot:]) if dot > 0 else None


@dataclass
class Refusal:
    commit: str
    path: str
    gate: str  # each gate that refused it
    signal: str  # what the first one saw: elision's signal, or the gate again
    message: str
    line: int | None
    context: list[str]


@dataclass
class Replay:
    name: str
    commits: int = 0
    judged: int = 0
    refused: int = 0
    by_gate: Counter[str] = field(default_factory=Counter)  # refusals by each gate
    kinds: Counter[str] = field(default_factory=Counter)  # edits judged, per kind
    kinds_refused: Counter[str] = field(default_factory=Counter)
    refusals: list[Refusal] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "commits": self.commits,
            "judged": self.judged,
            "refused": self.refused,
            "by_gate": dict(self.by_gate),
            "kinds": {
                k: {"judged": n, "refused": self.kinds_refused[k]}
                for k, n in sorted(self.kinds.items())
            },
            "refusals": [r.__dict__ for r in self.refusals],
            "seconds": round(self.seconds, 1),
        }


def edits(repo: Path, commits: int | None) -> list[tuple[str, bytes, bytes, bytes]]:
    """(commit, path, old blob, new blob) of each regular file modified along the
    first-parent history, oldest commit first; a merge is its diff to its first parent.
    The commits' hashes alone, for commits that modified no file, are (commit, b"", b"", b"")."""
    cmd = ["git", "-C", str(repo), "log", "--first-parent", "--diff-merges=first-parent"]
    cmd += ["--raw", "--no-renames", "--no-abbrev", "-z", "--format=%x01%H", "--reverse"]
    if commits is not None:
        cmd.append(f"--max-count={commits}")
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    found: list[tuple[str, bytes, bytes, bytes]] = []
    tokens = iter(out.split(b"\0"))
    commit = ""
    for token in tokens:
        token = token.lstrip(b"\n")
        if token.startswith(b"\x01"):
            commit = token[1:].decode()
            found.append((commit, b"", b"", b""))
        elif token.startswith(b":"):
            path = next(tokens)
            mode_a, mode_b, blob_a, blob_b, status = token[1:].split(b" ")
            if status == b"M" and mode_a in REGULAR and mode_b in REGULAR:
                found.append((commit, path, blob_a, blob_b))
    return found


class Blobs:
    """Blobs by id, from one ``git cat-file --batch``; None for one over ``limit`` bytes."""

    def __init__(self, repo: Path, limit: int) -> None:
        self.limit = limit
        self.proc = subprocess.Popen(
            ["git", "-C", str(repo), "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def get(self, blob: bytes) -> bytes | None:
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        stdin.write(blob + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3:
            raise RuntimeError(f"git cat-file: no blob {blob.decode()}")
        size = int(header[2])
        data = stdout.read(size + 1)[:size]  # and its newline
        return data if size <= self.limit else None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def replay(repo: Path, commits: int | None = None, name: str | None = None) -> Replay:
    """Judge each edit of ``repo``'s first-parent history (the last ``commits``) with the
    default policy's gates; the counts, and each refusal."""
    result = Replay(name or repo.name)
    config = Policy().gate
    started = time.perf_counter()
    blobs = Blobs(repo, gates.MAX_GATED_BYTES)
    try:
        for commit, path, blob_a, blob_b in edits(repo, commits):
            if not path:
                result.commits += 1
                continue
            what = kind(path)
            if what is None:
                continue
            old, new = blobs.get(blob_a), blobs.get(blob_b)
            if old is None or new is None or gates.is_binary(old):
                continue
            result.judged += 1
            result.kinds[what] += 1
            refusing = [f for f in gates.check(path, old, new, config) if f.action == "reject"]
            if not refusing:
                continue
            result.refused += 1
            result.kinds_refused[what] += 1
            for f in refusing:
                result.by_gate[f.gate] += 1
            first = refusing[0]
            line = first.details.get("line")
            result.refusals.append(
                Refusal(
                    commit[:10],
                    path.decode("utf-8", "replace"),
                    ",".join(f.gate for f in refusing),
                    first.details.get("signal", first.gate),
                    first.message,
                    line,
                    context(old, new, line),
                )
            )
    finally:
        blobs.close()
    result.seconds = time.perf_counter() - started
    return result


_HUNK = re.compile(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def context(old: bytes, new: bytes, line: int | None, most: int = 14) -> list[str]:
    """The diff's hunk nearest to the new text's ``line`` (the first hunk without one), at
    most ``most`` lines of it."""
    a = old.decode("utf-8", "replace").splitlines()
    b = new.decode("utf-8", "replace").splitlines()
    hunks: list[list[str]] = []
    for row in list(difflib.unified_diff(a, b, lineterm="", n=2))[2:]:
        if row.startswith("@@"):
            hunks.append([])
        if hunks:
            hunks[-1].append(row)
    if not hunks:
        return []

    def distance(hunk: list[str]) -> int:
        m = _HUNK.match(hunk[0])
        if m is None or line is None:
            return 0
        start, end = int(m[1]), int(m[1]) + int(m[2] or 1)
        return max(start - line, line - end, 0)

    chosen = min(hunks, key=distance)  # the first of the nearest
    rows = [r[:120] for r in chosen]
    return rows if len(rows) <= most else rows[:most] + [f"  ({len(rows) - most} more lines)"]


def rate(refused: int, judged: int) -> str:
    return f"{100 * refused / judged:.2f}%" if judged else "-"


def table(results: list[Replay]) -> str:
    w = max([len(r.name) for r in results] + [12]) + 2
    rows = [f"{'project':<{w}}{'commits':>8}{'judged':>8}{'refused':>8}{'rate':>8}   refused by"]
    for r in results:
        by = ", ".join(f"{g} {n}" for g, n in r.by_gate.most_common()) or "-"
        cells = f"{r.commits:>8}{r.judged:>8}{r.refused:>8}{rate(r.refused, r.judged):>8}"
        rows.append(f"{r.name:<{w}}{cells}   {by}")
    judged, refused = sum(r.judged for r in results), sum(r.refused for r in results)
    commits = sum(r.commits for r in results)
    rows.append(f"{'all':<{w}}{commits:>8}{judged:>8}{refused:>8}{rate(refused, judged):>8}")
    kinds: Counter[str] = sum((r.kinds for r in results), Counter())
    kinds_refused: Counter[str] = sum((r.kinds_refused for r in results), Counter())
    rows.append(f"\n{'kind':<{w}}{'':>8}{'judged':>8}{'refused':>8}{'rate':>8}")
    for k, n in kinds.most_common():
        rows.append(f"{k:<{w}}{'':>8}{n:>8}{kinds_refused[k]:>8}{rate(kinds_refused[k], n):>8}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("repos", nargs="+", metavar="[NAME=]REPO", help="a git directory")
    ap.add_argument("--commits", type=int, help="the last N first-parent commits (all)")
    ap.add_argument("--show", action="store_true", help="print each refused edit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = []
    for arg in args.repos:
        name, _, where = arg.rpartition("=")
        repo = Path(where)
        results.append(replay(repo, args.commits, name or repo.name.removesuffix(".git")))
    if args.json:
        print(json.dumps([r.as_json() for r in results], indent=1))
        return 0
    if args.show:
        for r in results:
            for x in r.refusals:
                print(f"{r.name} {x.commit} {x.path}: {x.gate} ({x.signal}): {x.message}")
                print("\n".join("    " + row for row in x.context))
        print()
    print("rwfs gates over version history: each modified file of each first-parent commit")
    print(f"({sum(r.seconds for r in results):.0f} s)")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
