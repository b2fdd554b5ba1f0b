"""Gate recall and false refusals on a corpus of real files, then gate latency: p50/p99 of
all gates on one commit, per format and file size.

The corpus is tests/gate_corpus.py's (the one tests/test_gate_corpus.py checks): files of
this machine's standard library, site-packages, npm and /usr/include, broken the way model
output breaks (failure variants: the rate refused is the recall) and edited the way people
edit (legitimate edits: the rate refused is the false-refusal rate), per variant kind.

Each sample is one call of ``rwfs.checks.gates.check`` as a commit makes it, in an edit session:
each version changes one line of the one before (a digit in a different place), so that no
gate stops early. The session's first commit is not timed: a file's first commit through
rwfs parses it in full (the "cold" column); later ones parse tree-sitter formats
incrementally from the previous version's tree. Run by ``scripts/bench gates``; the target
is p99 < 10 ms at 100 KB (SPEC §4.1).

``--mount`` times instead, through a real mount, a file's first edit after a mount: the
time ``open``, ``write`` and ``close`` of a 100 KB file take when the file was read (and the
mount then idle) before the edit, as an agent or an editor does, and when it was not.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rwfs.checks import gates
from rwfs.policy import Policy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import gate_corpus  # noqa: E402  (tests/, beside scripts/)

# One unit of each format; repeated (with fresh names) to reach each size.
UNITS = {
    "python": ("m.py", inspect.getsource(json.decoder)),
    "json": ("d.json", json.dumps({"name_N": {"items": list(range(20)), "ok": True}}, indent=2)),
    "toml": ("c.toml", '[table_N]\nname = "x"\nitems = [1, 2, 3]\nflag = true\n'),
    "yaml": ("c.yaml", "key_N:\n  items: [1, 2, 3]\n  name: x\n  nested:\n    flag: true\n"),
    "javascript": (
        "a.js",
        "export function f_N(xs) {\n  return xs.map((x) => x * 2).filter(Boolean);\n}\n",
    ),
    "typescript": (
        "a.ts",
        "export interface T_N {\n  id: number;\n}\nexport const v_N: T_N = { id: 1 };\n",
    ),
    "java": ("A.java", "class A_N {\n  int f(int x) {\n    return x * 2;\n  }\n}\n"),
    "go": ("a.go", "func f_N(x int) int {\n\treturn x * 2\n}\n"),
    "rust": ("a.rs", "pub fn f_N(x: i64) -> i64 {\n    x * 2\n}\n"),
    "c": ("a.c", "static int f_N(int x) {\n    return x * 2;\n}\n"),
    "cpp": ("a.cpp", "namespace n_N {\nint f(int x) { return x * 2; }\n}\n"),
    "ruby": ("a.rb", "def f_N(x)\n  x * 2\nend\n"),
    "bash": ("a.sh", 'f_N() {\n  echo "$1"\n}\n'),
}
SIZES = {"1 KB": 1 << 10, "100 KB": 100 << 10, "1 MB": 1 << 20}
PREFIX = {"go": "package main\n\n", "json": ""}


def build(fmt: str, size: int) -> bytes:
    _, unit = UNITS[fmt]
    if fmt == "json":  # one document: a list of units
        parts, n = [], 0
        while sum(map(len, parts)) < size:
            parts.append(unit.replace("name_N", f"name_{n}"))
            n += 1
        return ("[\n" + ",\n".join(parts) + "\n]\n").encode()
    out, n = [PREFIX.get(fmt, "")], 0
    while sum(map(len, out)) < size:
        out.append(unit.replace("_N", f"_{n}") + "\n")
        n += 1
    return "".join(out).encode()


def edit(data: bytes, n: int) -> bytes:
    """Change one line, keeping the text valid: the first digit after a point that moves
    with ``n`` becomes another digit."""
    start = len(data) * ((n * 37) % 100) // 100
    i = next((k for k in range(start, len(data) - 1) if _lone_digit(data, k)), None)
    if i is None:
        return data + b"\n"
    return data[:i] + (b"7" if data[i : i + 1] != b"7" else b"8") + data[i + 1 :]


def _lone_digit(data: bytes, k: int) -> bool:
    """A digit standing alone (not in a name, 0x1f, 1e5 or an escape): safe to change."""
    return (
        data[k : k + 1].isdigit()
        and not (data[k - 1 : k].isalnum() or data[k - 1 : k] in (b"_", b"\\"))
        and not data[k + 1 : k + 2].isalpha()
    )


def measure(fmt: str, size: int, samples: int) -> tuple[float, float, float]:
    """(p50, p99, cold) in ms: an edit session's commits, and its untimed first one."""
    name, _ = UNITS[fmt]
    old = build(fmt, size)
    cfg = Policy().gate
    gates.check(b"warm." + name.encode(), old, edit(old, 0), cfg)  # load grammar, patterns
    new = edit(old, 1)
    t = time.perf_counter()
    gates.check(name.encode(), old, new, cfg)  # the file's first commit: a full parse
    cold = (time.perf_counter() - t) * 1000
    times = []
    for n in range(samples):
        old, new = new, edit(new, n + 2)
        t = time.perf_counter()
        found = gates.check(name.encode(), old, new, cfg)
        times.append((time.perf_counter() - t) * 1000)
        assert found == [], f"{fmt}: an ordinary edit was refused: {found}"
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))], cold


def through_mount(samples: int) -> None:
    """p50/max of a first edit's write and close, with and without a read before it."""
    from bench import Mount  # scripts/bench.py, beside this file

    with tempfile.TemporaryDirectory(prefix="rwfs-bench-gates-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        files = {}
        for fmt in ("python", "yaml", "bash", "c", "ruby"):
            files[fmt] = build(fmt, 100 << 10)
            for k in range(2 * samples):
                (ws / f"{k}_{UNITS[fmt][0]}").write_bytes(files[fmt])
        m = Mount(ws, "group", Path(tmp) / "rwfs.log")
        m.start()
        try:
            print("first edit of a 100 KB file through the mount: open + write + close (ms)")
            print(f"{'format':<11}{'read first p50':>16}{'max':>8}{'not read p50':>16}{'max':>8}")
            for fmt, data in files.items():
                cells = ""
                for read_first in (True, False):
                    times = []
                    for k in range(samples):
                        path = ws / f"{k + (0 if read_first else samples)}_{UNITS[fmt][0]}"
                        if read_first:
                            assert path.read_bytes() == data
                            time.sleep(0.3)  # the writer thinks; the mount is idle
                        t = time.perf_counter()
                        path.write_bytes(edit(data, k + 1))
                        times.append((time.perf_counter() - t) * 1000)
                        time.sleep(0.1)
                    times.sort()
                    cells += f"{statistics.median(times):>16.2f}{times[-1]:>8.2f}"
                print(f"{fmt:<11}{cells}")
        finally:
            m.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=100, help="calls per cell (100; 1 MB: a fifth)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mount", action="store_true", help="time first edits through a mount")
    ap.add_argument(
        "--corpus-files", type=int, default=40, help="files per source group (40; 0: no corpus)"
    )
    ap.add_argument("--seed", type=int, default=15, help="the corpus's draw (15)")
    ap.add_argument(
        "--hard",
        type=int,
        default=0,
        metavar="N",
        help="instead, the harder elision corpus (scripts/gate_corpus_hard.py), N files a group",
    )
    args = ap.parse_args(argv)
    if args.mount:
        through_mount(max(3, args.samples // 10))
        return 0
    if args.hard:
        import gate_corpus_hard  # scripts/, beside this file

        return gate_corpus_hard.main(["--files", str(args.hard)])
    corpus = {}
    if args.corpus_files:
        t = time.perf_counter()
        cases = gate_corpus.corpus(args.seed, args.corpus_files)
        corpus = gate_corpus.evaluate(cases)
        took = time.perf_counter() - t
        if not args.json:
            files = len({c.source for c in cases})
            print(f"rwfs gates on a corpus: {len(cases)} cases from {files} real files")
            print(f"(seed {args.seed}, {args.corpus_files} files per source group; {took:.0f} s)")
            print(gate_corpus.table(corpus))
            print("target: at least 95% of failures refused, at most 1% of legitimate edits\n")
    rows = {}
    for fmt in UNITS:
        for label, size in SIZES.items():
            n = args.samples if size < (1 << 20) else max(5, args.samples // 5)
            rows[(fmt, label)] = measure(fmt, size, n)
    if args.json:
        print(
            json.dumps(
                {
                    "latency": [
                        {"format": f, "size": s, "p50_ms": a, "p99_ms": b, "cold_ms": c}
                        for (f, s), (a, b, c) in rows.items()
                    ],
                    "corpus": [
                        {"kind": k, "failure": bad, "cases": n, "refused": r}
                        for (bad, k), (n, r, _, _) in sorted(corpus.items())
                    ],
                }
            )
        )
        return 0
    head = f"{'format':<11}" + "".join(
        f"{label + ' p50':>12}{label + ' p99':>12}{label + ' cold':>12}" for label in SIZES
    )
    print("rwfs gate latency (all gates, one commit, ms)")
    print(head)
    print("-" * len(head))
    for fmt in UNITS:
        cells = "".join(
            f"{rows[(fmt, label)][0]:>12.2f}{rows[(fmt, label)][1]:>12.2f}"
            f"{rows[(fmt, label)][2]:>12.2f}"
            for label in SIZES
        )
        print(f"{fmt:<11}{cells}")
    worst = max(rows[(fmt, "100 KB")][1] for fmt in UNITS)
    verdict = "ok" if worst < 10 else "MISS"
    print(f"target: p99 < 10 ms at 100 KB — worst p99 at 100 KB: {worst:.2f} ms ({verdict})")
    print("cold: a file's first commit with nothing kept (a full parse); p50/p99: the commits")
    print("after. A mount parses a file it saw read ahead of its edit: see --mount")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
