"""scripts/replay_history.py on a tiny history: what it judges and what it counts.

A Python file added (with a binary file and a file of no known kind), one line of each
changed on a side branch and merged, then the Python file's tail cut off. Along the
first-parent history, only the two edits of the Python file are judged (the merge's, as
its diff to its first parent), and the cut is refused by the truncation gate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import replay_history  # noqa: E402  (scripts/, beside tests/)

FUNCS = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(20))


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    return subprocess.run([*cmd, *args], check=True, capture_output=True, text=True).stdout


def commit(repo: Path, files: dict[str, bytes]) -> str:
    for name, data in files.items():
        (repo / name).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    return git(repo, "rev-parse", "HEAD").strip()


def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """The first-parent commits: the files added; a merge of a side branch that changed
    one line of each; the Python file's tail cut off."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    edited = FUNCS.replace("x + 3\n", "x + 33\n")
    added = commit(repo, {"m.py": FUNCS.encode(), "blob.py": b"\0\1", "notes.xyz": b"a\n" * 50})
    git(repo, "switch", "-q", "-c", "side")
    commit(repo, {"m.py": edited.encode(), "blob.py": b"\0", "notes.xyz": b"a\n"})
    git(repo, "switch", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    merged = git(repo, "rev-parse", "HEAD").strip()
    cut = commit(repo, {"m.py": "".join(edited.splitlines(True)[:32]).encode()})
    return repo, [added, merged, cut]


def test_an_edit_and_a_cut_are_judged_and_the_cut_is_refused(tmp_path: Path) -> None:
    repo, commits = history(tmp_path)
    r = replay_history.replay(repo)
    assert (r.commits, r.judged, r.refused) == (3, 2, 1)
    assert r.by_gate == {"truncation": 1}
    assert (r.kinds, r.kinds_refused) == ({"python": 2}, {"python": 1})
    [refusal] = r.refusals
    assert (refusal.commit, refusal.path, refusal.gate) == (commits[2][:10], "m.py", "truncation")
    # The blank lines after f7 are the kept part's debris: the cut is after its body.
    assert refusal.line == 31 and "-def f8(x):" in refusal.context


def test_commits_bounds_the_history_to_its_last_ones(tmp_path: Path) -> None:
    repo, _ = history(tmp_path)
    r = replay_history.replay(repo, commits=1)
    assert (r.commits, r.judged, r.refused) == (1, 1, 1)
    r = replay_history.replay(repo, commits=2)
    assert (r.commits, r.judged, r.refused) == (2, 2, 1)
