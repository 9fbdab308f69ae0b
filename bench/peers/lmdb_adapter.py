"""Raw py-lmdb as the physical limit: one key per message, nothing else.

No hash chain, no index, no projection, no validation; keys are a 16-byte session id and a
big-endian message number, values the message as msgpack. The same durable settings as
sessionlog's default (`sync=True, metasync=True`). It has no fork: a fork copies the values.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any

import lmdb
import msgspec

from bench.peers._adapter import Adapter, Message

MAP_SIZE_BYTES = 8 * 1024**3  # address space only; the file grows with what is written
_NUMBER = struct.Struct(">Q")
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(dict[str, Any])


class LmdbAdapter(Adapter):
    name = "lmdb"
    title = "raw py-lmdb"
    distributions = ("lmdb",)
    fork_method = "no fork: the values are copied under a new id in one durable transaction"
    batch_method = "one durable write transaction per batch"

    _env: Any = None

    def open(self) -> None:
        self._env = lmdb.open(
            str(self.directory), map_size=MAP_SIZE_BYTES, sync=True, metasync=True
        )
        self._lengths: dict[bytes, int] = {}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def create(self) -> str:
        sid = uuid.uuid4()
        self._lengths[sid.bytes] = 0
        return str(sid)

    def _next(self, key: bytes) -> int:
        if key not in self._lengths:  # after a reopen: the last key of the session says it
            with self._env.begin() as txn:
                cursor = txn.cursor()
                found = cursor.set_range(key + _NUMBER.pack(2**64 - 1)) and cursor.prev()
                if not found:
                    found = cursor.last()
                last = cursor.key() if found else b""
                has = last[:16] == key
                self._lengths[key] = _NUMBER.unpack(last[16:])[0] + 1 if has else 0
        return self._lengths[key]

    def append(self, session_id: str, message: Message) -> None:
        self.append_batch(session_id, [message])

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        key = uuid.UUID(session_id).bytes
        first = self._next(key)
        with self._env.begin(write=True) as txn:
            for offset, message in enumerate(messages):
                txn.put(key + _NUMBER.pack(first + offset), _ENCODER.encode(message))
        self._lengths[key] = first + len(messages)

    def _values(self, key: bytes) -> list[bytes]:
        with self._env.begin() as txn:
            cursor = txn.cursor()
            out: list[bytes] = []
            if cursor.set_range(key):
                for found, value in cursor:
                    if found[:16] != key:
                        break
                    out.append(bytes(value))
            return out

    def read(self, session_id: str) -> list[Any]:
        return [_DECODER.decode(value) for value in self._values(uuid.UUID(session_id).bytes)]

    def contents(self, transcript: list[Any]) -> list[str]:
        return [message["content"] for message in transcript]

    def fork(self, session_id: str) -> str:
        values = self._values(uuid.UUID(session_id).bytes)
        child = uuid.uuid4()
        with self._env.begin(write=True) as txn:
            for number, value in enumerate(values):
                txn.put(child.bytes + _NUMBER.pack(number), value)
        self._lengths[child.bytes] = len(values)
        return str(child)

    def durability(self) -> dict[str, Any]:
        flags = self._env.flags() if self._env is not None else {}
        return {
            "settings": f"LMDB sync={flags.get('sync')}, metasync={flags.get('metasync')}",
            "durable": bool(flags.get("sync")) and bool(flags.get("metasync")),
            "note": "",
        }
