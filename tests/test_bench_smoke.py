"""Every benchmark suite runs to its end at its quick sizes and measures each of its rows.

The numbers are not judged here (timing belongs to `bench`, not to tests); what is checked is that
a change to the engine has not left a suite crashing, as the replay suite's seed phases once did
when the importer's kept messages stopped being a list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as bench_main

ROOT = Path(__file__).resolve().parent.parent
NEEDS = {"viewer": "BROWSER", "postgres": "POSTGRES"}
"""The suites that need something of the machine, as the tests that need it are marked."""
SUITES = [
    pytest.param(suite.name, marks=[pytest.mark.needs(NEEDS[suite.name])])
    if suite.name in NEEDS
    else suite.name
    for suite in bench_main.SUITES
]


@pytest.mark.parametrize("suite", SUITES)
def test_a_suite_runs_and_measures_every_row(suite: str, tmp_path: Path) -> None:
    out = tmp_path / f"{suite}.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--suite", suite, "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["results"] if isinstance(report, dict) else report
    assert rows, f"the {suite} suite measured nothing"
    for row in rows:
        assert row["ours"] > 0 and row["baseline"] > 0, row["name"]
