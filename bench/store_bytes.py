"""Where the bytes of an LMDB store go: `python -m bench.store_bytes [--messages N] [--path DIR]`.

Without `--path`, builds the store the peers' bytes-per-message row measures (bench/peers: one
session grown by `N` durable `inject` calls after a few appends to another, through the public
engine) in a scratch directory, closes it and splits it; with `--path`, splits that store (closed,
format 2, 3 or 4) and counts `--messages` messages in it.

The split, per message: the records (the message text, and the envelope around it: hash,
position, stream id, version, time, meta, field names), their LMDB nodes (8-byte key, node
header, slot), what the leaf pages of events leave unused (records are appended, each page
filled as far as whole records fit), the stream index, each projection prefix, the branch
pages, and the free pages LMDB keeps for reuse (the pages the last commits replaced; a constant,
not a share per message). The data file is all of them: LMDB without a write map grows the file
by the pages it uses, never by map steps, and never shrinks it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from bench.peers._workloads import WARM_APPENDS, make_messages
from eventlog._lmdb import TREE_TXN_TYPES
from eventlog._lmdb_cluster import logical_key
from eventlog._packing import unpack
from projections._keys import kind_of

ROOT = Path(__file__).resolve().parent.parent
PAGE_HEADER = 16  # bytes of an LMDB page before its slots
NODE_HEADER = 8  # bytes of a leaf node before its key
SLOT = 2  # the page's pointer to each node


def region(key: bytes) -> str:
    """The part of format 2's tree a key belongs to (see eventlog/_lmdb_tree.py), projection
    keys by their prefix, the single ones together."""
    first = key[:1]
    if first == b"\xff":
        return "events"
    logical = logical_key(key) if first == b"i" else None
    if logical is not None:  # format 4: a cluster key
        kind = kind_of(logical) or "?"
        return "projection " + (kind if kind.endswith("/") or kind == "@" else "single keys")
    if first == b"k":
        kind = kind_of(key[1:]) or "?"
        return "projection " + (kind if kind.endswith("/") or kind == "@" else "single keys")
    names = {b"i": "stream index", b"f": "stream floors", b"q": "idempotency keys"}
    return names.get(first, "format marker, anchor")


def _content(record: bytes) -> int:
    """Bytes of what the caller stored in a record's messages: a text `content` as UTF-8, an
    `item` as its msgpack encoding (the rest of the record is the envelope around them)."""
    data = msgspec.msgpack.decode(record)[6]
    total = 0
    for message in data.get("messages") or [data.get("message") or {}]:
        content, item = message.get("content"), message.get("item")
        total += len(content.encode()) if isinstance(content, str) else 0
        total += len(msgspec.msgpack.encode(item)) if item is not None else 0
    return total


def _append_pages(nodes: list[int], page: int) -> int:
    """Leaf pages that appending nodes of these sizes fills, each page as far as whole nodes fit."""
    pages, used = 1, 0
    for node in nodes:
        if used + node > page - PAGE_HEADER:
            pages, used = pages + 1, 0
        used += node
    return pages


def split(path: Path, messages: int) -> dict[str, Any]:
    """The store's bytes by share, in bytes per message (and the totals they come from)."""
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        stat, info = env.stat(), env.info()
        regions: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        nodes: list[int] = []
        content = unpacked = 0
        with env.begin(buffers=True) as txn:
            marker = txn.get(b"mformat")
            if marker is None or bytes(marker) not in TREE_TXN_TYPES:
                raise SystemExit(f"{path}: not a format-2, 3 or 4 sessionlog store")
            for key, value in txn.cursor():
                name = region(bytes(key))
                entry = regions[name]
                entry[0] += 1
                entry[1] += len(key)
                entry[2] += len(value)
                if name == "events":
                    nodes.append(NODE_HEADER + len(key) + len(value) + len(value) % 2 + SLOT)
                    record = bytes(unpack(value))
                    content += _content(record)
                    unpacked += len(record)
    finally:
        env.close()
    page = stat["psize"]
    file_bytes = (path / "data.mdb").stat().st_size
    tree_pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
    event_pages = _append_pages(nodes, page)
    events = regions.pop("events")
    per = 1 / messages
    shares = {
        "message content": content * per,
        "record envelope": (unpacked - content) * per,
        "saved by packing (format 3)": (events[2] - unpacked) * per,
        "event key and node": (sum(nodes) - events[2]) * per,
        "event pages left unused": (event_pages * page - sum(nodes)) * per,
    }
    for name, (_count, key_bytes, value_bytes) in sorted(regions.items()):
        shares[name] = (key_bytes + value_bytes) * per
    other_leaves = stat["leaf_pages"] + stat["overflow_pages"] - event_pages
    other_logical = sum(k + v for _, k, v in regions.values())
    shares["other leaf pages left unused"] = (other_leaves * page - other_logical) * per
    shares["branch pages"] = stat["branch_pages"] * page * per
    shares["free pages"] = (info["last_pgno"] + 1 - 2 - tree_pages) * page * per
    shares["meta pages"] = 2 * page * per
    return {
        "messages": messages,
        "file_bytes": file_bytes,
        "file_bytes_per_message": file_bytes * per,
        "event_page_fill": sum(nodes) / (event_pages * page),
        "shares_per_message": shares,
    }


def grow(path: Path, messages: int) -> int:
    """The peers' grown session: a few appends to one session, `messages` to another."""
    from sessions import SessionStore

    store = SessionStore.open(path)
    try:
        grown, warm = store.open_session(), store.open_session()
        for message in make_messages(WARM_APPENDS, seed=301):
            store.inject(warm, message)
        for message in make_messages(messages, seed=300):
            store.inject(grown, message)
    finally:
        store.close()
    return messages + WARM_APPENDS


def report(found: dict[str, Any]) -> str:
    lines = [
        f"{found['file_bytes']:,} bytes in data.mdb for {found['messages']:,} messages: "
        f"{found['file_bytes_per_message']:.1f} B per message "
        f"(event pages {found['event_page_fill']:.0%} full)"
    ]
    for name, value in found["shares_per_message"].items():
        lines.append(f"  {name:32s} {value:8.1f} B")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--path", type=Path, help="a closed format-2 or 3 store to split instead")
    args = parser.parse_args()
    if args.path is not None:
        print(report(split(args.path, args.messages)))
        return
    scratch = ROOT / "var" / "bench-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="store-bytes-", dir=scratch))
    try:
        print(report(split(where, grow(where, args.messages))))
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
