"""The append-only, hash-chained event log that every sessionlog projection is rebuilt from.

Imports none of the other sessionlog packages.
"""

from eventlog import events, limits
from eventlog._codec import GENESIS_HASH, Envelope
from eventlog._log import (
    ANY,
    NO_STREAM,
    EventLog,
    ExpectedVersion,
    LogView,
    Subscription,
    Transaction,
    VerifyReport,
)
from eventlog.errors import (
    CapacityError,
    ConcurrencyError,
    ControllerConflictError,
    CorruptStoreError,
    IntegrityError,
    InvalidArgumentError,
    LimitExceededError,
    LogClosedError,
    SessionExistsError,
    SessionLogError,
    StorageError,
    StoreFullError,
    UnknownSessionError,
)

__all__ = [
    "ANY",
    "GENESIS_HASH",
    "NO_STREAM",
    "CapacityError",
    "ConcurrencyError",
    "ControllerConflictError",
    "CorruptStoreError",
    "Envelope",
    "EventLog",
    "ExpectedVersion",
    "IntegrityError",
    "InvalidArgumentError",
    "LimitExceededError",
    "LogClosedError",
    "LogView",
    "SessionExistsError",
    "SessionLogError",
    "StorageError",
    "StoreFullError",
    "Subscription",
    "Transaction",
    "UnknownSessionError",
    "VerifyReport",
    "events",
    "limits",
]
