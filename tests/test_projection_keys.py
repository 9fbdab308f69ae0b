"""The one table of the projection key space (`projections/_keys.py`): no two entries overlap, and
every key the folds write for every event of the catalog is in it."""

from __future__ import annotations

import json
from pathlib import Path

import projections as pj
from sessions import SessionStore

FIXTURE = Path(__file__).parent / "fixtures" / "log-format-v1.jsonl"


def test_no_entry_of_the_table_overlaps_another() -> None:
    entries = [*pj.KEYS, *pj.KEY_PREFIXES]
    assert len(entries) == len(set(entries))
    for entry in entries:
        others = [other for other in entries if other != entry and entry.startswith(other)]
        assert others == [], f"{entry!r} falls under {others!r}"
    for key in pj.KEYS:
        assert pj.kind_of(key) == key.decode()


def test_every_key_the_folds_write_is_in_the_table(tmp_path: Path) -> None:
    records = [bytes.fromhex(json.loads(line)["hex"]) for line in FIXTURE.read_text().splitlines()]
    with SessionStore.open(tmp_path / "store") as store:
        store.log.import_records(records)  # one event of every type, folded by the projector
        with store.log.view() as view:
            keys = [key for key, _ in view.kv_scan()]
    kinds = {pj.kind_of(key) for key in keys}
    assert None not in kinds, [key for key in keys if pj.kind_of(key) is None]
    assert {"h/", "@", "g/", "V", "rt/s/", "cx/p/", "cx/v/"} <= kinds
    assert pj.kind_of(b"zz/not-ours") is None
