"""Key-encryption keys: what wraps each session's data key, from a key file or the environment.

A `KeyProvider` only wraps and unwraps 32-byte data keys under a context, the two calls a cloud
KMS offers (encrypt and decrypt with an encryption context), so one can stand in for the local
provider here. A provider never sees a message; the data keys never leave the process unwrapped.
"""

from __future__ import annotations

import os
import secrets
from typing import Protocol

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventlog.errors import InvalidArgumentError, MissingKeyError, WrongKeyError

DATA_KEY_BYTES = 32
"""AES-256: the data keys and the local key-encryption key."""
NONCE_BYTES = 12
"""AES-GCM's nonce; random per encryption (2^-32 collision odds only after 2^32 uses of a key)."""
ENV_VARIABLE = "SESSIONLOG_KEK"
"""The environment variable `LocalKeyProvider.from_env` reads by default (64 hex digits)."""


class KeyProvider(Protocol):
    """Wraps the data keys of a store. `key_id` names the key-encryption key (never the key);
    `unwrap` raises `WrongKeyError` when the wrapped bytes are not its own."""

    @property
    def key_id(self) -> str: ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes: ...


class LocalKeyProvider:
    """A 32-byte key-encryption key held in this process: AES-256-GCM wraps each data key, its
    context as associated data (so a wrapped key cannot be moved to another slot)."""

    __slots__ = ("_aead", "key_id")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != DATA_KEY_BYTES:
            got = len(key) if isinstance(key, bytes) else type(key).__name__
            raise InvalidArgumentError(
                f"a key-encryption key must be {DATA_KEY_BYTES} bytes, got {got}",
                expected=DATA_KEY_BYTES,
                got=got,
            )
        self._aead = AESGCM(key)
        # A fingerprint to tell keys apart in messages: a hash, never the key.
        self.key_id = "local:" + blake3.blake3(b"sessionlog kek id\x00" + key).hexdigest(8)

    @staticmethod
    def new_key() -> str:
        """A fresh random key as the text a key file or the variable holds (64 hex digits)."""
        return secrets.token_hex(DATA_KEY_BYTES)

    @classmethod
    def from_text(cls, text: str, where: str) -> LocalKeyProvider:
        shown = text.strip()
        try:
            key = bytes.fromhex(shown)
        except ValueError:
            key = b""
        if len(key) != DATA_KEY_BYTES:
            raise InvalidArgumentError(
                f"{where}: expected {2 * DATA_KEY_BYTES} hex digits (a {DATA_KEY_BYTES}-byte key), "
                f"got {len(shown)} characters",
                where=where,
                expected=2 * DATA_KEY_BYTES,
                got=len(shown),
            )
        return cls(key)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LocalKeyProvider:
        """The key in a file of 64 hex digits (see `new_key`)."""
        try:
            with open(path, encoding="ascii") as file:
                text = file.read(4 * DATA_KEY_BYTES)
        except (OSError, UnicodeDecodeError) as exc:
            raise MissingKeyError(f"key file `{os.fspath(path)}`: {exc}") from exc
        return cls.from_text(text, f"key file `{os.fspath(path)}`")

    @classmethod
    def from_env(cls, name: str = ENV_VARIABLE) -> LocalKeyProvider:
        """The key in environment variable `name` (64 hex digits)."""
        text = os.environ.get(name)
        if text is None:
            raise MissingKeyError(f"the environment variable `{name}` holds no key")
        return cls.from_text(text, f"environment variable `{name}`")

    @classmethod
    def from_env_if_set(cls, name: str = ENV_VARIABLE) -> LocalKeyProvider | None:
        """`from_env` when the variable is set, else None: how the command line and the service
        open a store, with keys when the environment holds one."""
        return cls.from_env(name) if name in os.environ else None

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], context)
        except (InvalidTag, ValueError) as exc:
            raise WrongKeyError(
                f"the key-encryption key {self.key_id} does not open this data key; "
                "open the store with the key it was written with"
            ) from exc
