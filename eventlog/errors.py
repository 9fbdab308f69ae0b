"""The one exception tree of sessionlog, rooted at `SessionLogError`.

Subclasses also inherit the builtin a caller would expect (`ValueError`, `KeyError`, `OSError`), so
`except ValueError` keeps working. Every layer raises from this tree; `lmdb` and `msgspec` errors are
translated inside `eventlog/` and never escape it.
"""

from __future__ import annotations


class SessionLogError(Exception):
    """Root of every error sessionlog raises on purpose.

    Besides its message, an error carries its facts as fields, None when they do not apply, so a
    caller reads them instead of parsing the message: `index` (the failing item of a batch, as
    `inject_many`'s `messages[index]`), `where` (the verb or place that refused), `expected` and
    `got` (the value asked for or allowed, and the one found)."""

    index: int | None = None
    where: str | None = None
    expected: object = None
    got: object = None

    def __init__(
        self,
        *args: object,
        index: int | None = None,
        where: str | None = None,
        expected: object = None,
        got: object = None,
    ) -> None:
        super().__init__(*args)
        self.index = index
        self.where = where
        self.expected = expected
        self.got = got


class InvalidArgumentError(SessionLogError, ValueError):
    """The caller passed something malformed: a wrong type, an unknown option, a bad value."""


class LimitExceededError(InvalidArgumentError):
    """A value went past one of the bounds in `eventlog.limits`."""

    def __init__(self, what: str, limit_name: str, limit: int, actual: int) -> None:
        self.what = what
        self.limit_name = limit_name
        self.limit = limit
        self.actual = actual
        super().__init__(
            f"{what}: {actual} exceeds {limit_name} = {limit}", expected=limit, got=actual
        )


class ConcurrencyError(SessionLogError):
    """An append expected a stream version that is no longer (or not yet) the stream's version."""

    def __init__(self, stream: str, expected: object, actual: int) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        shown = actual if actual else "no stream"
        super().__init__(
            f"expected version {expected} for stream `{stream}`, got {shown}",
            expected=expected,
            got=actual,
        )


class LengthConflictError(ConcurrencyError):
    """A write expected the transcript to hold `expected` entries and it held `actual`: another
    writer got there first. Nothing was written; read again and retry."""

    def __init__(self, session_id: str, expected: int, actual: int, verb: str) -> None:
        SessionLogError.__init__(
            self,
            f"{verb}: session `{session_id}` holds {actual} entries, not the expected {expected}; "
            "another writer changed it, nothing was written",
            where=verb,
            expected=expected,
            got=actual,
        )
        self.stream = session_id
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
        self.verb = verb


class IntegrityError(SessionLogError):
    """Stored bytes do not match their hash chain, or the indexes disagree with the events."""

    def __init__(self, message: str, position: int | None = None) -> None:
        self.position = position
        super().__init__(message)


class CorruptStoreError(IntegrityError):
    """A store cannot be opened because its files are not a sessionlog store, or are damaged."""


class TruncatedError(SessionLogError, LookupError):
    """A read asked for events that `EventLog.truncate` removed from the log: positions up to
    the anchor live only in an archive now. Nothing is wrong with the store; read after the
    anchor (`EventLog.anchor`) instead."""

    def __init__(self, message: str, position: int | None, anchor: int) -> None:
        self.position = position
        self.anchor = anchor
        super().__init__(
            f"{message}: positions 1 to {anchor} were truncated from the log, which now starts "
            f"after position {anchor}",
            expected=f"a position after {anchor}",
            got=position,
        )

    def __str__(self) -> str:  # LookupError would quote the message otherwise
        return str(self.args[0])


class StorageError(SessionLogError, OSError):
    """The storage layer failed for a reason outside the caller's input (disk, locks, map)."""


class StoreFormatError(StorageError):
    """A sessionlog store in a format this version cannot read as it is: one written by a newer
    version (open it with that version or a later one), or an older PostgreSQL schema opened
    read-only (open it once writable to migrate it). Nothing is wrong with its contents. `got`
    is the store's format, `expected` what this version reads."""


class StoreBusyError(StorageError):
    """An operation that needs a store to itself (compacting its files) found another process
    with it open; nothing was changed."""


class StoreFullError(StorageError):
    """A transaction outgrew the map space kept free for it (`headroom_bytes`) and wrote nothing.

    The map grows before the next write by twice what the transaction had written when it ran
    out, so a retry fits unless the transaction then writes more than that; every retry grows the
    map again. `EventLog.append` retries once by itself, which is enough for one append.
    """


class OutcomeUnknownError(StorageError):
    """The connection to a database server was lost during a commit: the transaction may or may
    not have committed. Retrying an append that carries `meta["idempotency_key"]` is safe: if the
    first attempt committed, the retry returns its positions and writes nothing."""


class LogClosedError(SessionLogError):
    """The log (or store) was used after `close()`."""


class LeaseHeldError(SessionLogError):
    """A lease on a store (`EventLog.lease`; the runtime takes `runtime`) is held by another
    holder that is still alive; nothing was changed. Start again once that one has stopped."""

    def __init__(self, name: str, where: str, holder: str) -> None:
        self.name = name
        self.holder = holder
        super().__init__(
            f"{where}: the `{name}` lease is held by {holder}; only one holder at a time, so "
            "stop that one first",
            where=where,
        )


class LeaseLostError(SessionLogError):
    """A lease this process held has ended without being released: the PostgreSQL connection
    that held it dropped, so the server let it go and another holder may have it now. Whatever
    the lease guarded must stop; take the lease again to go on."""

    def __init__(self, name: str, where: str) -> None:
        self.name = name
        super().__init__(
            f"{where}: the `{name}` lease was lost (its connection ended); another holder may "
            "have taken it, so this one must stop",
            where=where,
        )


class UnknownSessionError(SessionLogError, KeyError):
    """A lifecycle verb named a session id that does not exist."""

    def __init__(self, session_id: str, verb: str | None = None, *, closed: bool = False) -> None:
        self.session_id = session_id
        self.verb = verb
        self.closed = closed
        """The session exists but is closed: it can be read, not written, nor followed."""
        shown = f"{verb}: " if verb else ""
        what = (
            f"session `{session_id}` is closed (`open_session` opens it again)"
            if closed
            else f"no session `{session_id}`"
        )
        super().__init__(shown + what, where=verb)

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class SessionExistsError(SessionLogError):
    """A command asked for a new session under an id that is already taken."""


class ControllerConflictError(SessionLogError):
    """A live client tried to act as controller of a session another client controls."""


class CapacityError(SessionLogError):
    """A configured capacity (sessions, clients) is reached; nothing was written."""


# Configuration (a store backend, the delegation runtime); the runtime's own errors live in
# `sessions.runtime`.


class ConfigurationError(InvalidArgumentError):
    """Something the installation or configuration lacks: a `postgresql://` store without the
    PostgreSQL driver installed, or a runtime provider that is not registered, an input filter or
    hook that is not callable."""


# Encryption at rest (`sessions/_keyring.py`, `sessions/_seal.py`).


class KeyUnavailableError(SessionLogError):
    """Sealed content could not be opened, or sealed, because a key is missing or is not the
    store's. Nothing was read into plaintext and nothing was written or destroyed."""


class MissingKeyError(KeyUnavailableError):
    """The store is encrypted and was opened without a key provider (`keys=`)."""


class WrongKeyError(KeyUnavailableError):
    """The key provider's key-encryption key does not open this store's data keys: another key
    file, or a rotated-away key. Reopen with the right one; nothing was changed."""


class ForgottenError(SessionLogError, LookupError):
    """The session was forgotten (`store.forget`): its data key is destroyed, so its content can
    never be read again. Its ancestry and event kinds remain."""

    def __init__(self, session_id: str, verb: str | None = None, reason: str | None = None) -> None:
        self.session_id = session_id
        self.verb = verb
        self.reason = reason
        shown = f"{verb}: " if verb else ""
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"{shown}session `{session_id}` was forgotten{why}: its content is gone for good",
            where=verb,
        )
