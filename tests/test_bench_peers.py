"""The peers benchmark's plumbing at tiny sizes, in this environment (no peer is installed here,
and nothing is installed by the test): the driver runs the sessionlog and raw py-lmdb adapters in
subprocesses, reports the peers it cannot import as not run, and writes the JSON shape the report
and bench/PEERS.md are built from. It measures nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers import _report
from bench.peers._worker import ADAPTERS

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("durable_append", "batched_append", "grow", "reopen_read", "fork")


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    markdown = out.with_suffix(".md")
    done = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--tiny", "--quiet", "--json", str(out),
         "--markdown", str(markdown), "--only", "sessionlog", "--only", "lmdb",
         "--only", "google-adk"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    data["_stdout"] = done.stdout
    data["_markdown"] = markdown.read_text()
    return data


def test_each_adapter_ran_every_workload_and_read_it_back(document: dict) -> None:
    adapters = document["adapters"]
    assert list(adapters) == ["sessionlog", "lmdb", "google-adk"]
    for name in ("sessionlog", "lmdb"):
        result = adapters[name]
        assert set(WORKLOADS) <= set(result), name
        assert result["durable_append"]["rate"] > 0
        assert len(result["durable_append"]["rounds"]) == 2
        assert result["batched_append"]["batch_messages"] == 5
        assert result["grow"]["messages"] == 12
        assert result["grow"]["bytes_per_message"] > 0
        assert result["reopen_read"]["messages"] == 12
        assert result["fork"]["forks"] == 2
        assert result["durability"]["durable"] is True
        assert result["versions"]["lmdb"]
    # Only sessionlog takes appends from many threads at once.
    assert adapters["sessionlog"]["concurrent_append"]["rate"] > 0
    assert "concurrent_append" not in adapters["lmdb"]


def test_a_peer_missing_here_is_reported_not_run(document: dict) -> None:
    missing = document["adapters"]["google-adk"]
    assert set(missing) == {"adapter", "missing"}
    assert missing["missing"].endswith(" is not installed")
    assert f"google-adk: not run ({missing['missing']})" in document["_stdout"]


def test_the_report_has_a_ratio_per_figure_and_the_targets(document: dict) -> None:
    text = document["_stdout"]
    for row in _report.ROWS:
        label = row.label.format(window=3, messages="12")
        assert label in text
    assert "raw py-lmdb" in text
    # Only the flat-cost target can be judged without a peer.
    assert [t["target"] for t in document["targets"]] == [
        "flat append cost at 12 messages (last/first <= 1.5)"
    ]
    assert document["_markdown"].startswith("# sessionlog against its peers")
    assert "| workload | sessionlog | raw py-lmdb |" in document["_markdown"]


def test_targets_are_judged_against_the_best_peer_only() -> None:
    def figures(rate: float, fork_s: float, bytes_per_message: float) -> dict:
        return {
            "durable_append": {"rate": rate},
            "grow": {"ratio": 1.0, "messages": 2000, "bytes_per_message": bytes_per_message},
            "fork": {"seconds": fork_s},
        }

    ours = figures(1000, 0.001, 500)
    ours["concurrent_append"] = {"rate": 5400}
    results = {
        "sessionlog": ours,
        "lmdb": figures(5000, 0.0001, 100),  # the physical limit is never a peer
        "a": figures(900, 0.2, 600),
        "b": figures(1100, 0.05, 400),
    }
    verdicts = {t["target"].split(" (")[0]: t for t in _report.targets(results)}
    assert verdicts["durable appends ahead of every peer"]["passed"] is False
    assert verdicts["durable appends ahead of every peer"]["best_peer"] == "b"
    assert verdicts["flat append cost at 2,000 messages"]["passed"] is True
    fork = verdicts["fork at least 100x faster than the fastest peer"]
    assert (fork["best_peer"], fork["passed"]) == ("b", False)
    assert fork["advantage"] == pytest.approx(50)
    assert verdicts["fewer bytes per message than every peer"]["passed"] is False
    writers = verdicts["16 writers' durable appends at least 5x the best peer's durable appends"]
    assert (writers["best_peer"], writers["passed"]) == ("b", False)  # 5400 / 1100 < 5
    assert writers["advantage"] == pytest.approx(5400 / 1100)


def test_the_worker_knows_every_adapter_by_its_command_line_name() -> None:
    assert list(ADAPTERS) == [
        "sessionlog", "lmdb", "eventsourcing", "langgraph", "openai-agents", "google-adk"
    ]  # fmt: skip
