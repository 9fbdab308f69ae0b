"""The peers table, the targets and bench/PEERS.md, from the workers' JSON figures.

Reads figures only; it never runs a library. Ratios are sessionlog's advantage on every row (its
figure over the peer's where higher is better, the peer's over its figure where lower is better),
so a ratio above 1 always means sessionlog did better, whatever the unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._timing import _duration, _number
from bench.peers._workloads import WRITERS

OURS = "sessionlog"
LIMIT = "lmdb"  # the physical limit: shown, never a peer that a target compares with
FLAT_RATIO_MAX = 1.5
"""Most the median of the last appends may cost over the first ones and still count as flat: one
fsync's latency moves by tens of percent on a shared disk, while a cost that grows with the
transcript would be many times over at 2,000 messages."""
FORK_ADVANTAGE_MIN = 100.0  # the target: fork at least 100x faster than the fastest peer
CONCURRENT_ADVANTAGE_MIN = 5.0
"""The issue's target: 16 writer threads' durable appends at least 5x the best peer's durable
appends (one writer: the peers have no shared commit to gain from more)."""


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[dict[str, Any]], float]
    show: Callable[[float], str]
    higher_is_better: bool
    compare: bool = True  # False: a figure of each library alone (no ratio to sessionlog)


def _rate(value: float) -> str:
    return f"{_number(value)}/s"


def _bytes(value: float) -> str:
    return f"{_number(value)} B"


ROWS = (
    Row(
        "durable append (messages/s)",
        lambda r: r["durable_append"]["rate"],
        _rate,
        higher_is_better=True,
    ),
    Row(
        "batched append (messages/s)",
        lambda r: r["batched_append"]["rate"],
        _rate,
        higher_is_better=True,
    ),
    Row(
        "reopen + read {messages} messages", lambda r: r["reopen_read"]["seconds"], _duration, False
    ),
    Row("append 1..{window} (median)", lambda r: r["grow"]["first_s"], _duration, False),
    Row("append last {window} (median)", lambda r: r["grow"]["last_s"], _duration, False),
    Row(
        "growth: last {window} / first {window}",
        lambda r: r["grow"]["ratio"],
        lambda v: f"{v:.2f}",
        higher_is_better=False,
        compare=False,
    ),
    Row("fork of {messages} messages", lambda r: r["fork"]["seconds"], _duration, False),
    Row("bytes written per fork", lambda r: r["fork"]["bytes_per_fork"], _bytes, False),
    Row(
        "bytes on disk per message",
        lambda r: r["grow"]["bytes_per_message"],
        _bytes,
        higher_is_better=False,
    ),
)


def _advantage(row: Row, ours: float, theirs: float) -> float:
    if row.higher_is_better:
        return ours / theirs if theirs > 0 else float("inf")
    return theirs / ours if ours > 0 else float("inf")


def _ratio(value: float) -> str:
    if value == float("inf"):
        return "n/a: sessionlog's is 0"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def grid(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The table as rows of cells: a header, then one row per figure, one column per adapter."""
    names = [n for n, r in results.items() if "missing" not in r]
    header = ["workload", *(results[n]["title"] for n in names)]
    rows = [header]
    ours = results.get(OURS)
    first = results[names[0]]["grow"] if names else {"window": 0, "messages": 0}
    for row in ROWS:
        cells = [row.label.format(window=first["window"], messages=f"{first['messages']:,}")]
        for name in names:
            value = row.value(results[name])
            cell = row.show(value)
            if ours is not None and "missing" not in ours and name != OURS and row.compare:
                cell += f" ({_ratio(_advantage(row, row.value(ours), value))})"
            cells.append(cell)
        rows.append(cells)
    return rows


def text_table(cells: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for number, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(parts).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + "|".join(["---"] * len(cells[0])) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in cells[1:])
    return "\n".join(lines)


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's four targets, each with pass/miss and the figures that decided it."""
    ours = results.get(OURS)
    peers = {n: r for n, r in results.items() if n not in (OURS, LIMIT) and "missing" not in r}
    if ours is None or "missing" in ours:
        return []
    out: list[dict[str, Any]] = []

    def versus(key: str, value: Callable[[dict[str, Any]], float], higher: bool) -> None:
        if not peers:
            return
        best_name = (max if higher else min)(peers, key=lambda n: value(peers[n]))
        best, mine = value(peers[best_name]), value(ours)
        out.append(
            {
                "target": key,
                "passed": mine > best if higher else mine < best,
                "ours": mine,
                "best_peer": best_name,
                "best_peer_value": best,
            }
        )

    versus("durable appends ahead of every peer", ROWS[0].value, higher=True)
    ratio = ours["grow"]["ratio"]
    out.append(
        {
            "target": f"flat append cost at {ours['grow']['messages']:,} messages "
            f"(last/first <= {FLAT_RATIO_MAX:g})",
            "passed": ratio <= FLAT_RATIO_MAX,
            "ours": ratio,
        }
    )
    if peers:
        fastest = min(peers, key=lambda n: peers[n]["fork"]["seconds"])
        advantage = peers[fastest]["fork"]["seconds"] / ours["fork"]["seconds"]
        out.append(
            {
                "target": f"fork at least {FORK_ADVANTAGE_MIN:g}x faster than the fastest peer",
                "passed": advantage >= FORK_ADVANTAGE_MIN,
                "ours": ours["fork"]["seconds"],
                "best_peer": fastest,
                "best_peer_value": peers[fastest]["fork"]["seconds"],
                "advantage": advantage,
            }
        )
    versus("fewer bytes per message than every peer", ROWS[-1].value, higher=False)
    concurrent = ours.get("concurrent_append")
    if concurrent is not None and peers:
        best = max(peers, key=lambda n: ROWS[0].value(peers[n]))
        advantage = concurrent["rate"] / ROWS[0].value(peers[best])
        out.append(
            {
                "target": f"{WRITERS} writers' durable appends at least "
                f"{CONCURRENT_ADVANTAGE_MIN:g}x the best peer's durable appends",
                "passed": advantage >= CONCURRENT_ADVANTAGE_MIN,
                "ours": concurrent["rate"],
                "best_peer": best,
                "best_peer_value": ROWS[0].value(peers[best]),
                "advantage": advantage,
            }
        )
    return out


def target_lines(found: list[dict[str, Any]]) -> list[str]:
    lines = []
    for t in found:
        verdict = "pass" if t["passed"] else "MISS"
        detail = ""
        if "best_peer" in t:
            detail = f" (sessionlog {_number(t['ours'])}, best peer {t['best_peer']} "
            detail += f"{_number(t['best_peer_value'])}"
            if "advantage" in t:
                detail += f"; {_ratio(t['advantage'])}"
            detail += ")"
        else:
            detail = f" (last/first {t['ours']:.2f})"
        lines.append(f"{verdict}: {t['target']}{detail}")
    return lines


def durability_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, r in results.items():
        if "missing" in r:
            lines.append(f"{name}: not run ({r['missing']})")
            continue
        d = r["durability"]
        durable = "durable" if d["durable"] else "NOT durable against power loss"
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        lines.append(f"{r['title']} ({versions}): {d['settings']}; {durable}")
        lines.append(f"    fork: {r['fork_method']}; {r['fork']['forks']} forks timed")
        lines.append(f"    batch: {r['batch_method']}")
    return lines


METHOD_NOTES = (
    "Every library runs with its own defaults and each reads back as durable: LMDB's durable "
    "commit syncs twice (the data pages, then the meta page), while SQLite in WAL mode with "
    "synchronous=FULL syncs the WAL once per commit and in rollback-journal mode (ADK) several "
    "times.",
    "The first appends of a fresh file cost more for every library (the file and its journal "
    "grow; later commits reuse their pages), which is why some growth ratios are below 1.",
    "LangGraph's SqliteSaver keeps the whole message list in every checkpoint, so each append "
    "writes the transcript again; its bytes per message grow with the session.",
    "Bytes are the growth of the store's files, measured closed: LMDB grows in 4 KiB pages and "
    "reuses freed ones, so a figure of a few hundred bytes per fork is an average over the forks.",
    "Raw py-lmdb is the physical limit (one key per message, no hash chain, index or "
    "projection); no target compares with it.",
)


@dataclass(frozen=True)
class Report:
    text: str
    markdown: str


def _sizes_sentence(document: dict[str, Any]) -> str:
    adapters = [r for r in document["adapters"].values() if "missing" not in r]
    if not adapters:
        return ""
    r = adapters[0]
    return (
        f"durable append: {len(r['durable_append']['rounds'])} rounds of single-message "
        f"commits; batched: {r['batched_append']['batch_messages']} messages per commit; "
        f"the grown session: {r['grow']['messages']:,} messages, one durable append each, the "
        f"first and last {r['grow']['window']} compared; reopen + read: "
        f"{len(r['reopen_read']['rounds'])} rounds; forks of the grown session: up to "
        f"{max(a['fork']['forks'] for a in adapters)} per library"
    )


def render(document: dict[str, Any]) -> Report:
    results = document["adapters"]
    cells = grid(results)
    found = document["targets"]
    m = document["machine"]
    fs = document["filesystem"]
    when = (
        f"{document['started_at']}, {document['sizes']} sizes, {document['passes']} pass(es); "
        f"{m['platform']}, Python {m['python']}, {m['cpus']} CPUs, stores on {fs['type']}"
    )
    legend = (
        "In parentheses: sessionlog's advantage over that library (above 1: sessionlog did "
        "better; for times and bytes, the library's figure over sessionlog's)."
    )
    text = "\n".join(
        [
            f"sessionlog against its peers ({when})",
            "",
            text_table(cells),
            "",
            legend,
            _sizes_sentence(document),
            "",
            "durability and methods:",
            *durability_lines(results),
            "",
            "targets:",
            *target_lines(found),
        ]
    )
    markdown = "\n".join(
        [
            "# sessionlog against its peers",
            "",
            "Written by `make bench-peers` (`python -m bench.peers` in a virtualenv holding the "
            "peers); do not edit by hand. Each library runs in a process of its own, through its "
            "public API and with its own durability defaults, over the same messages (80 to 900 "
            "characters of text). Times are wall-clock medians; bytes are the growth of the "
            "store's files, measured with the store closed.",
            "",
            f"Run: {when}. Command: `make bench-peers` (`BENCH_ARGS=--quick` for a smoke run).",
            "",
            markdown_table(cells),
            "",
            legend + " " + _sizes_sentence(document) + ".",
            "",
            "## Durability, fork and batch, per library",
            "",
            *(
                f"  - {line.strip()}" if line.startswith(" ") else f"- {line}"
                for line in durability_lines(results)
            ),
            "",
            "## Targets",
            "",
            *(f"- {line}" for line in target_lines(found)),
            "",
            "## How to read it",
            "",
            *(f"- {line}" for line in METHOD_NOTES),
            "",
        ]
    )
    return Report(text=text, markdown=markdown)
