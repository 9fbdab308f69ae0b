"""The reference pages in docs/ are written from the code: they must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from eventlog import events

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_catalog_page_names_every_event_and_field() -> None:
    page = (ROOT / "docs" / "events.md").read_text()
    for kind in events.EVENT_TYPES:
        assert f"### `{kind.__struct_config__.tag}`" in page
        for name in kind.__struct_fields__:
            assert f"| `{name}` |" in page, (kind, name)
