"""The append-only, hash-chained event log that every sessionlog projection is rebuilt from.

Imports none of the other sessionlog packages.
"""

from eventlog import events, limits
from eventlog._chain import RecordChecker
from eventlog._codec import (
    GENESIS_HASH,
    Envelope,
    StructCodec,
    check_encodable,
    convert,
    to_builtins,
)
from eventlog._lease import Lease
from eventlog._log import (
    ANY,
    NO_STREAM,
    EventLog,
    ExpectedVersion,
    LogView,
    Projector,
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
    LeaseHeldError,
    LengthConflictError,
    LimitExceededError,
    LogClosedError,
    OutcomeUnknownError,
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
    "Lease",
    "LeaseHeldError",
    "LengthConflictError",
    "LimitExceededError",
    "LogClosedError",
    "LogView",
    "OutcomeUnknownError",
    "Projector",
    "RecordChecker",
    "SessionExistsError",
    "SessionLogError",
    "StorageError",
    "StoreFullError",
    "StructCodec",
    "Subscription",
    "Transaction",
    "UnknownSessionError",
    "VerifyReport",
    "check_encodable",
    "convert",
    "events",
    "limits",
    "to_builtins",
]
