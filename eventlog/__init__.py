"""The append-only, hash-chained event log that every sessionlog projection is rebuilt from.

Imports none of the other sessionlog packages.
"""

from eventlog import events, limits
from eventlog._chain import RecordChecker
from eventlog._checks import ANY, NO_STREAM, ExpectedVersion
from eventlog._codec import (
    DECODE_ERRORS,
    GENESIS_HASH,
    Envelope,
    StructCodec,
    check_encodable,
    convert,
    json_copy,
    to_builtins,
)
from eventlog._lease import Lease
from eventlog._log import EventLog
from eventlog._plain import check_plain
from eventlog._storage import CLUSTER_PREFIX, cluster_key
from eventlog._subscribe import Subscription
from eventlog._transaction import Projector, Transaction
from eventlog._verify import VerifyReport
from eventlog._view import LogView
from eventlog.errors import (
    CapacityError,
    ConcurrencyError,
    ControllerConflictError,
    CorruptStoreError,
    ForgottenError,
    IntegrityError,
    InvalidArgumentError,
    KeyUnavailableError,
    LeaseHeldError,
    LeaseLostError,
    LengthConflictError,
    LimitExceededError,
    LogClosedError,
    MissingKeyError,
    OutcomeUnknownError,
    SessionExistsError,
    SessionLogError,
    StorageError,
    StoreBusyError,
    StoreFormatError,
    StoreFullError,
    TruncatedError,
    UnknownSessionError,
    WrongKeyError,
)

__all__ = [
    "ANY",
    "CLUSTER_PREFIX",
    "GENESIS_HASH",
    "NO_STREAM",
    "CapacityError",
    "ConcurrencyError",
    "ControllerConflictError",
    "CorruptStoreError",
    "Envelope",
    "EventLog",
    "ForgottenError",
    "ExpectedVersion",
    "IntegrityError",
    "InvalidArgumentError",
    "KeyUnavailableError",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "LengthConflictError",
    "LimitExceededError",
    "LogClosedError",
    "LogView",
    "MissingKeyError",
    "OutcomeUnknownError",
    "Projector",
    "RecordChecker",
    "SessionExistsError",
    "SessionLogError",
    "StorageError",
    "StoreBusyError",
    "StoreFormatError",
    "StoreFullError",
    "DECODE_ERRORS",
    "StructCodec",
    "Subscription",
    "Transaction",
    "TruncatedError",
    "UnknownSessionError",
    "VerifyReport",
    "WrongKeyError",
    "check_encodable",
    "check_plain",
    "cluster_key",
    "convert",
    "json_copy",
    "events",
    "limits",
    "to_builtins",
]
