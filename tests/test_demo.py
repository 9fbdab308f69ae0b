"""`make demo` from a clean clone of the repository, run twice, as a newcomer would type it.

The clone reuses this test's virtualenv (`VENV=...`, its install stamp marked old-but-fine with
`make -o`) so nothing is reinstalled; the demo itself imports the clone's own code.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("seed", "continue", "fork", "fork_at", "live", "compact", "crash", "verify", "export")


def make_demo(clone: Path) -> subprocess.CompletedProcess[str]:
    venv = Path(sys.prefix)
    stamp = venv / ".demo-stamp"
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(clone),
            "demo",
            f"VENV={venv}",
            "-o",
            str(stamp),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_make_demo_runs_from_a_clean_clone_twice(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    assert not (clone / "var").exists()
    outputs = []
    for _ in range(2):  # the second run starts over from an empty var/demo and tells the same story
        done = make_demo(clone)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        outputs.append(done.stdout)
    first, second = outputs
    lines = first.splitlines()
    assert len(lines) <= 40, "one screen"
    steps = [line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "]
    assert steps[: len(STEPS)] == list(STEPS)
    crash = re.search(r"after (\d+) acknowledged appends; reopened: (\d+) present, 0 lost", first)
    assert crash is not None, first
    assert 0 < int(crash.group(1)) <= int(crash.group(2))
    assert re.search(r"continue\s+runtime \+ mock provider: .mock reply to: ", first)
    assert re.search(r"verify\s+ok: \d+ events, 4 streams", first)
    assert "release-1-at-4" in first and "forked at message 4" in first
    assert re.search(r"head hash\s+[0-9a-f]{64}", first)
    assert lines[-8].startswith("done in ")
    explore = lines[lines.index("explore it (the store stays until the next `make demo`):") + 1 :]
    assert len(explore) == 5 and explore[-2].endswith(" tail --follow")
    assert explore[-1].endswith(" --store var/demo/sessions serve --port 8700")
    for line in explore[:-2]:  # each printed command runs as printed, from the clone
        words = shlex.split(line)
        assert words[0] == str(Path(sys.prefix) / "bin" / "sessionlog")
        assert words[1:3] == ["--store", "var/demo/sessions"]
        done = subprocess.run(words, cwd=clone, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "release-1" in done.stdout, (line, done.stderr)

    def without_hashes_and_times(text: str) -> str:
        return re.sub(r"[0-9a-f]{16,64}|\d+\.\d s|\d+ acknowledged.*lost|\d+ events|[\d,]+$", "",
                      text, flags=re.M)  # fmt: skip

    assert without_hashes_and_times(first) == without_hashes_and_times(second)
    bundle = json.loads((clone / "var" / "demo" / "release-1.bundle.json").read_text())
    assert bundle["redaction"]["mode"] == "sanitized"
    assert bundle["redaction"]["entries"], "the sample's CI token is redacted"
    assert "ghx-31415" not in json.dumps(bundle)
