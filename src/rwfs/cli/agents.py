"""``rwfs agents-md``: the paragraph that tells an agent how to work in a workspace rwfs guards."""

from __future__ import annotations

import argparse

AGENTS_MD = """\
## Files in this workspace are written through rwfs

This workspace is mounted through rwfs: every file you write is committed atomically and
journaled, and a write that would break a file is refused. Its control directory is `.rw/`
(hidden from `ls`, but there).

- If `close()` (or `fsync()`, or the `rename()` of a temp file onto a file) fails with
  **EBADMSG** ("Bad message"; Node.js: "Unknown system error -74"), your write was refused:
  it would have broken the file (a syntax error where it parsed before, the file cut short,
  or a placeholder such as "... rest of the code unchanged ..." standing for deleted code).
  The file is unchanged, and a line starting `rwfs:` on the command's stderr says why.
  Read `.rw/why/<path>` (JSON: `message`, `details.line`, `retry_budget`), read the file
  again, and re-apply your edit in full. Your refused draft is at `.rw/rejected/<id>` (the
  envelope's `draft`). When `retry_budget` reaches 0, change strategy instead of sending
  the same text again.
- If the refused change is deliberate (you meant to delete most of a file, keep only its
  first lines, remove old code), do not work around the gate: run `rwfs allow PATH` (or
  `echo 'allow PATH' > .rw/ctl`, PATH relative to the workspace's top), then write the
  file again, or copy your draft over it (`cp .rw/rejected/<id> PATH`). The envelope's
  `allow` gives both commands. It lets your next write of that one file through, once,
  within 10 minutes, and the journal records it as allowed. It never lets a secret
  through.
- A shell redirection (`echo ... > file`) ignores these errors: after writing that way,
  check `.rw/last-error`, or that the file holds what you wrote.
- **ESTALE** ("Stale file handle"; Node.js: "Unknown system error -116") means the file
  changed under you: another process changed it after you read it, or before your write
  could land. The file keeps that other version. Read it again and re-apply your edit; your
  bytes, the version you started from and a three-way merge are in `.rw/conflicts/<id>/`
  (`intended`, `base`, `merged`); `echo keep-actual > .rw/conflicts/<id>/ctl` (or
  `take-intended`, or `resolved` after merging by hand) settles it.
- **EIO** means the journal cannot commit: that write was not made (the file keeps its
  previous bytes), or, from `fsync()` of a file closed earlier, its commit is queued and
  not durable yet. `.rw/last-error` says which; `.rw/status` (`journal`) says since when.
- `.rw/history/<path>/` holds every earlier version of a file (also of deleted files);
  `mkdir .rw/snapshots/NAME` names this point, and `echo 'restore NAME' > .rw/ctl` brings
  the files back to it (`echo 'undo BATCH' > .rw/ctl` undoes one batch). Both are
  digest-guarded: a file changed since becomes a conflict instead of being overwritten.
- Before you stop, write a short Markdown note to `.rw/handoff` (what is done, what is
  next); rwfs adds the files committed since the last note. Read `.rw/handoff` first when
  you start: its `drift` lists files that changed after the note was written.
- For an edit that spans files, open a batch: `mkdir .rw/batches/NAME`, write the files as
  usual (the mount shows them, the real tree waits), read `.rw/batches/NAME/diff`, then
  `echo commit > .rw/batches/NAME/ctl`: all files change at once, or none do and
  `.rw/batches/NAME/status` says why. `.rw/notices` tells you about a batch a crash
  interrupted (`resume` or `rollback` in its `ctl`).
- Without writing: `cat .rw/validate/<path>` says whether a file parses, `.rw/risk/<path>`
  whether it looks like it holds a secret. `.rw/journal` lists recent commits with the
  digests they expected and wrote; `rwfs log <path>` all of them.
"""


# How to hand the paragraph to common agents (docs/cli.md has the longer version).
RECIPES = """\
# Hand the agent the paragraph (rwfs agents-md), then run it in the mount:
rwfs agents-md >> CLAUDE.md            # Claude Code reads CLAUDE.md
rwfs run -- claude
rwfs agents-md >> AGENTS.md            # Codex CLI reads AGENTS.md
rwfs run -- codex
rwfs agents-md >> GEMINI.md            # Gemini CLI reads GEMINI.md
rwfs run -- gemini
rwfs agents-md > .rw-conventions.md    # aider takes a conventions file
rwfs run -- aider --read .rw-conventions.md
# Any other agent: paste the paragraph where it reads project instructions.
# rwfs run --review -- AGENT holds every write in a batch until you commit it at exit.
"""


def cmd_agents_md(a: argparse.Namespace) -> int:
    print(RECIPES if a.recipes else AGENTS_MD, end="")
    return 0
