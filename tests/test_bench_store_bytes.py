"""`bench/store_bytes.py` splits a real store's file into shares that add up to it exactly, and
counts the stored message text as the text given."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers._workloads import WARM_APPENDS, make_messages
from bench.store_bytes import grow, region, split


def test_the_shares_add_up_to_the_file_and_the_content_is_the_text(tmp_path: Path) -> None:
    count = grow(tmp_path, 40)
    found = split(tmp_path, count)
    shares = found["shares_per_message"]
    assert sum(shares.values()) * count == pytest.approx(found["file_bytes"])
    text = make_messages(40, seed=300) + make_messages(WARM_APPENDS, seed=301)
    assert shares["message content"] * count == sum(len(m["content"].encode()) for m in text)
    assert shares["stream index"] > 0 and shares["projection @"] > 0  # transcripts, with refs
    assert 0 < found["event_page_fill"] <= 1
    assert shares["saved by packing (format 3)"] < 0  # a new store packs these messages


def test_keys_are_named_by_their_region() -> None:
    assert region(b"\xff" + bytes(7)) == "events"
    assert region(b"kh/s") == "projection h/" and region(b"kV") == "projection single keys"
    assert region(b"k@s\x00t") == "projection @"
    assert region(b"is\x00" + bytes(4)) == "stream index"
