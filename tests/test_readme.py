"""The README's example is code a newcomer will paste: run it exactly as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    return blocks[0]


def test_the_readme_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = example()
    assert len(code.strip().splitlines()) <= 12
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.strip() == "['Hello!', 'What if?']"
    assert (tmp_path / "var" / "example" / "data.mdb").exists()
