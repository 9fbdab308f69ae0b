"""The public session engine: every verb of a session's life, as events and projections.

Composes `eventlog` and `projections`. `SessionStore.open(path)` is the entry point.
"""

from eventlog import (
    CapacityError,
    ConcurrencyError,
    ControllerConflictError,
    ForgottenError,
    IntegrityError,
    InvalidArgumentError,
    KeyUnavailableError,
    LengthConflictError,
    LimitExceededError,
    MissingKeyError,
    SessionExistsError,
    SessionLogError,
    UnknownSessionError,
    WrongKeyError,
)
from sessions._batches import PackedMessages
from sessions._context_policy import ContextPolicy
from sessions._ids import current_id, uuid7
from sessions._keys import KeyProvider, LocalKeyProvider
from sessions._retention import (
    ArchiveSink,
    DirectorySink,
    RetentionPolicy,
    SweepReport,
    archive_line,
)
from sessions._store import SessionStore, SessionSubscription
from sessions._tokens import BearerSession, BearerSessions

__all__ = [
    "ArchiveSink",
    "BearerSession",
    "BearerSessions",
    "CapacityError",
    "ConcurrencyError",
    "ContextPolicy",
    "ControllerConflictError",
    "ForgottenError",
    "DirectorySink",
    "IntegrityError",
    "InvalidArgumentError",
    "KeyProvider",
    "KeyUnavailableError",
    "LengthConflictError",
    "LimitExceededError",
    "LocalKeyProvider",
    "MissingKeyError",
    "PackedMessages",
    "RetentionPolicy",
    "SessionExistsError",
    "SessionLogError",
    "SessionStore",
    "SessionSubscription",
    "SweepReport",
    "UnknownSessionError",
    "WrongKeyError",
    "archive_line",
    "current_id",
    "uuid7",
]
