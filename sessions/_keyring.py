"""The keyring: every session's data key, wrapped by the key-encryption key, in fixed-size slots.

The keyring lives beside the log, never inside it: a log is append-only and a B-tree keeps freed
pages, while a key that is forgotten must leave no copy in any file. So each wrapped key has a slot
of its own in one small file (`keyring` in the store's directory), written in place: a new key
is written and synced before any event names it, forgetting overwrites its slot with zeros and
syncs, and rotation writes every slot re-wrapped to a new file that replaces the old one by an
atomic rename (the old file's blocks then belong to no file). Every write runs inside the log's
write transaction, which is the lock between processes. The key-encryption key never touches it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeGuard

import blake3
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventlog.errors import (
    CorruptStoreError,
    ForgottenError,
    MissingKeyError,
    StorageError,
    WrongKeyError,
)
from sessions._keys import DATA_KEY_BYTES, KeyProvider

if TYPE_CHECKING:
    from projections import SessionState

SLOT_BYTES = 512
"""One wrapped key per slot, slot 0 the header: room for a cloud KMS's wrapped key (about 200
bytes), and one disk sector, so zeroing a slot is one sector write."""
_MAGIC = b"SLKEYS01"
_RECORD = b"K1"
_ABSENT = b"K0"
"""A slot skipped over because the log names it, while this keyring never held its key."""
_CHECK_CONTEXT = b"sessionlog keyring check"
_EMPTY = bytes(SLOT_BYTES)
FILE_NAME = "keyring"
_DIGEST_CONTEXT = "sessionlog 2026-12 keyed digests of a session's idempotency keys"
"""blake3's key derivation context: the digest key is derived from the data key, never stored."""
DIGEST_BYTES = 16
"""A keyed digest of a caller's text: 128 bits, as the projection's own index digests."""
KEYED_TEXT = "\x00keyed:"
"""How a caller's text kept as a keyed digest starts (then the digest in hex)."""


def is_keyed(stored: str | None) -> TypeGuard[str]:
    """Whether `stored` is a caller's text kept as its keyed digest (`Keyring.keyed`), not as
    it is."""
    return stored is not None and stored.startswith(KEYED_TEXT)


def owner_digest(session_id: str) -> bytes:
    return blake3.blake3(session_id.encode()).digest(16)


def _context(slot: int, owner: bytes) -> bytes:
    return b"sessionlog data key\x00" + slot.to_bytes(8, "big") + owner


def _pack(*parts: bytes) -> bytes:
    out = b"".join(struct.pack(">H", len(part)) + part for part in parts)
    if len(out) + len(_MAGIC) > SLOT_BYTES:
        raise AssertionError("a keyring record outgrew its slot")
    return out


def _unpack(data: bytes, count: int, where: str) -> list[bytes]:
    parts, offset = [], 0
    for _ in range(count):
        if offset + 2 > len(data):
            raise CorruptStoreError(f"keyring: {where} is cut short")
        (size,) = struct.unpack_from(">H", data, offset)
        parts.append(data[offset + 2 : offset + 2 + size])
        offset += 2 + size
    return parts


class SlotStore(Protocol):
    """Where the slots live: memory, a file beside an LMDB store, or a table of a database
    store (`eventlog/_pg_keyring.py`). `write` and `replace` are durable when they return."""

    def exists(self) -> bool: ...

    def read(self, slot: int) -> bytes: ...

    def count(self) -> int: ...

    def write(self, slot: int, record: bytes) -> None: ...

    def replace(self, records: list[bytes]) -> None: ...

    def tidy(self) -> None: ...


class Slots:
    """The keyring's bytes in memory (for the in-memory store); `FileSlots` keeps them on disk."""

    def __init__(self) -> None:
        self._data = bytearray()

    def exists(self) -> bool:
        return bool(self._data)

    def read(self, slot: int) -> bytes:
        return bytes(self._data[slot * SLOT_BYTES : (slot + 1) * SLOT_BYTES])

    def count(self) -> int:
        return -(-len(self._data) // SLOT_BYTES)

    def write(self, slot: int, record: bytes) -> None:
        end = (slot + 1) * SLOT_BYTES
        if len(self._data) < end:
            self._data.extend(bytes(end - len(self._data)))
        self._data[slot * SLOT_BYTES : end] = record.ljust(SLOT_BYTES, b"\x00")

    def replace(self, records: list[bytes]) -> None:
        self._data = bytearray(b"".join(r.ljust(SLOT_BYTES, b"\x00") for r in records))

    def tidy(self) -> None:
        """Remove what an interrupted rotation left behind (nothing in memory)."""


class FileSlots(Slots):
    """The keyring file of a store directory, read and written through fresh descriptors (a
    rotation in another process replaces the file)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._new = directory / (FILE_NAME + ".new")

    def exists(self) -> bool:
        return self.path.exists()

    def read(self, slot: int) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, SLOT_BYTES, slot * SLOT_BYTES)
        finally:
            os.close(fd)

    def count(self) -> int:
        try:
            return -(-self.path.stat().st_size // SLOT_BYTES)
        except FileNotFoundError:
            return 0

    def write(self, slot: int, record: bytes) -> None:
        _write_synced(self.path, os.O_CREAT, record.ljust(SLOT_BYTES, b"\x00"), slot * SLOT_BYTES)
        if slot == 0:
            _sync_directory(self.path.parent)

    def replace(self, records: list[bytes]) -> None:
        data = b"".join(r.ljust(SLOT_BYTES, b"\x00") for r in records)
        _write_synced(self._new, os.O_CREAT | os.O_TRUNC, data, 0)
        os.replace(self._new, self.path)
        _sync_directory(self.path.parent)

    def has_leftover(self) -> bool:
        return self._new.exists()

    def tidy(self) -> None:
        if self._new.exists():
            # A rotation died before its rename: the old keyring stands. Zero the copy before
            # unlinking it, so a key forgotten later has no copy in it either.
            size = self._new.stat().st_size
            with open(self._new, "r+b") as file:
                file.write(bytes(size))
                file.flush()
                os.fsync(file.fileno())
            self._new.unlink()
            _sync_directory(self.path.parent)


def _write_synced(path: Path, flags: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset` and sync it; a write cut short (a full disk) goes on until
    the system refuses, which is a `StorageError`: a keyring must never stand with part of it."""
    try:
        fd = os.open(path, os.O_WRONLY | flags, 0o600)
        try:
            left = memoryview(data)
            while left:
                written = os.pwrite(fd, left, offset)
                left, offset = left[written:], offset + written
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"keyring: writing `{path.name}`: {exc}") from exc


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Keyring:
    """Data keys by slot: made, opened (cached unwrapped in this process), shredded, re-wrapped.
    The writing calls must run inside the log's write transaction."""

    def __init__(self, slots: SlotStore, provider: KeyProvider | None) -> None:
        self.slots = slots
        self.provider = provider
        self._keys: dict[int, AESGCM] = {}
        self._digest_keys: dict[int, bytes] = {}
        """Beside each cached data key, the key of `keyed`, derived from it (memory only)."""
        self._checked = False

    @property
    def encrypted(self) -> bool:
        return self.provider is not None or self.slots.exists()

    def _header(self) -> tuple[str, bytes, bytes] | None:
        """(key id, check, pending shred) of the keyring; None when there is none yet."""
        data = self.slots.read(0)
        if not data:
            return None
        if not data.startswith(_MAGIC):
            raise CorruptStoreError("keyring: the header does not start with the keyring magic")
        key_id, check, pending = _unpack(data[len(_MAGIC) :], 3, "the header")
        return key_id.decode(), check, pending

    def _write_header(self, key_id: str, check: bytes, pending: bytes) -> None:
        self.slots.write(0, _MAGIC + _pack(key_id.encode(), check, pending))

    def pending_shred(self) -> tuple[int, str] | None:
        """The slot and session a `forget` was destroying when it stopped, if one was."""
        header = self._header()
        if header is None or not header[2]:
            return None
        pending = header[2]
        return int.from_bytes(pending[:8], "big"), pending[8:].decode()

    def begin_shred(self, slot: int, session_id: str) -> None:
        """Name `slot` in the header as being destroyed, synced, before the event that says so
        commits: whoever opens the store next finishes or drops it (`sessions/_shred.py`)."""
        header = self._header()
        if header is None:
            raise AssertionError("a shred of a keyring that has no header")
        self._write_header(header[0], header[1], slot.to_bytes(8, "big") + session_id.encode())

    def end_shred(self, destroy: bool) -> None:
        """Zero the pending slot (when `destroy`), then clear the pending mark."""
        header, pending = self._header(), self.pending_shred()
        if header is None or pending is None:
            return
        if destroy:
            self.shred(pending[0])
        self._write_header(header[0], header[1], b"")

    def provider_checked(self, where: str, *, fresh: bool = False) -> KeyProvider:
        """The provider, once it is known to open this keyring; writes the header of a new one.
        `fresh` reads the header again (before wrapping a new key: another process may have
        rotated the keyring to another key since)."""
        provider = self.provider
        if provider is None:
            raise MissingKeyError(
                f"{where}: the store is encrypted; open it with keys= (a KeyProvider)", where=where
            )
        if self._checked and not fresh:
            return provider
        header = self._header()
        if header is not None and self._checked and header[0] == provider.key_id:
            return provider
        if header is None:
            check = provider.wrap(bytes(DATA_KEY_BYTES), _CHECK_CONTEXT)
            self._write_header(provider.key_id, check, b"")
        else:
            key_id, check, _ = header
            try:
                if self._checked:  # it opened the header before: the keyring was rotated since
                    raise WrongKeyError(f"the keyring is now wrapped by {key_id}")
                provider.unwrap(check, _CHECK_CONTEXT)
            except WrongKeyError as exc:
                raise WrongKeyError(
                    f"{where}: the store's keys are wrapped by {key_id}, not by "
                    f"{provider.key_id}; nothing was read or written",
                    where=where,
                    expected=key_id,
                    got=provider.key_id,
                ) from exc
        self._checked = True
        return provider

    def new_key(self, owner: str, where: str, above: int = 0) -> tuple[int, AESGCM]:
        """A fresh data key for session `owner` in a new slot above `above` (the highest slot
        the log names), on disk before this returns."""
        provider = self.provider_checked(where, fresh=True)
        slot = max(self.slots.count(), 1)
        for skipped in range(slot, above + 1):  # named by a log whose keyring is elsewhere
            self.slots.write(skipped, _ABSENT)
        slot = max(slot, above + 1)
        key = AESGCM.generate_key(bit_length=8 * DATA_KEY_BYTES)
        digest = owner_digest(owner)
        wrapped = provider.wrap(key, _context(slot, digest))
        self.slots.write(slot, _RECORD + _pack(digest, wrapped))
        return slot, self._cache(slot, key)

    def key(self, slot: int, where: str, *, fresh: bool = False) -> AESGCM | None:
        """The data key of `slot`; None when it was shredded. `fresh` reads the slot again even
        when this process holds the key (another process may have forgotten it). A slot the
        keyring never had (a log imported without its keyring) is a `MissingKeyError`."""
        if not fresh:
            cached = self._keys.get(slot)
            if cached is not None:
                return cached
        record = self.slots.read(slot)
        if not record or slot == 0 or record.startswith(_ABSENT):
            raise MissingKeyError(
                f"{where}: the keyring holds no key {slot}: this log's keyring is not here",
                where=where,
                got=slot,
            )
        if record == _EMPTY[: len(record)]:
            self._keys.pop(slot, None)
            self._digest_keys.pop(slot, None)
            return None
        cached = self._keys.get(slot)
        if cached is not None:
            return cached
        provider = self.provider_checked(where)
        if not record.startswith(_RECORD):
            raise CorruptStoreError(f"keyring: slot {slot} holds no key record")
        digest, wrapped = _unpack(record[len(_RECORD) :], 2, f"slot {slot}")
        return self._cache(slot, provider.unwrap(wrapped, _context(slot, digest)))

    def _cache(self, slot: int, key: bytes) -> AESGCM:
        aead = AESGCM(key)
        self._keys[slot] = aead
        self._digest_keys[slot] = blake3.blake3(key, derive_key_context=_DIGEST_CONTEXT).digest()
        return aead

    def keyed(self, slot: int, text: str, where: str) -> str | None:
        """`text` as an encrypted session keeps a caller's idempotency key or request id: its
        digest under a key derived from the data key of `slot` (`KEYED_TEXT` and hex). The same
        text gives the same digest while the key lives, so a retry finds it; once the key is
        shredded (None) no guess of the text can be checked against it."""
        if self.key(slot, where) is None:
            return None
        key = self._digest_keys.get(slot)
        if key is None:  # shredded by another thread since `key` looked
            return None
        digest = blake3.blake3(text.encode("utf-8", "surrogatepass"), key=key)
        return KEYED_TEXT + digest.hexdigest(DIGEST_BYTES)

    def keyed_for(self, state: SessionState, text: str, where: str) -> str | None:
        """`keyed` for the session of `state`: None for a plain session (its texts are kept as
        they are), `ForgottenError` once it was forgotten."""
        if not state.key_slot:
            return None
        keyed = None if state.forgotten else self.keyed(state.key_slot, text, where)
        if keyed is None:
            raise ForgottenError(state.session_id, where, state.forgotten_reason)
        return keyed

    def shred(self, slot: int) -> None:
        """Overwrite the slot with zeros, synced: the wrapped key is gone from the file."""
        self._keys.pop(slot, None)
        self._digest_keys.pop(slot, None)
        self.slots.tidy()
        if slot > 0 and self.slots.read(slot).strip(b"\x00"):
            self.slots.write(slot, _EMPTY)

    def rotate(self, new: KeyProvider, where: str) -> int:
        """Re-wrap every live data key under `new`, replacing the keyring in one rename; the
        events are not touched. Returns the number of keys re-wrapped."""
        old = self.provider_checked(where, fresh=True)
        if self.pending_shred() is not None:
            raise AssertionError("rotate: finish the pending shred first")
        self.slots.tidy()
        check = new.wrap(bytes(DATA_KEY_BYTES), _CHECK_CONTEXT)
        records, moved = [_MAGIC + _pack(new.key_id.encode(), check, b"")], 0
        for slot in range(1, self.slots.count()):
            record = self.slots.read(slot)
            if record.startswith(_RECORD):
                digest, wrapped = _unpack(record[len(_RECORD) :], 2, f"slot {slot}")
                key = old.unwrap(wrapped, _context(slot, digest))
                record = _RECORD + _pack(digest, new.wrap(key, _context(slot, digest)))
                moved += 1
            elif not record.startswith(_ABSENT):
                record = _EMPTY
            records.append(record)
        self.slots.replace(records)
        self.provider = new
        return moved
