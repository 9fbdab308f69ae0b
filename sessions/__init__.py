"""The public session engine: every verb of a session's life, as events and projections.

Composes `eventlog` and `projections`. `SessionStore.open(path)` is the entry point.
"""

from eventlog import (
    CapacityError,
    ConcurrencyError,
    ControllerConflictError,
    IntegrityError,
    InvalidArgumentError,
    LengthConflictError,
    LimitExceededError,
    SessionExistsError,
    SessionLogError,
    UnknownSessionError,
)
from sessions._context_policy import ContextPolicy
from sessions._ids import current_id, uuid7
from sessions._store import SessionStore, SessionSubscription
from sessions._tokens import BearerSession, BearerSessions

__all__ = [
    "BearerSession",
    "BearerSessions",
    "CapacityError",
    "ConcurrencyError",
    "ContextPolicy",
    "ControllerConflictError",
    "IntegrityError",
    "InvalidArgumentError",
    "LengthConflictError",
    "LimitExceededError",
    "SessionExistsError",
    "SessionLogError",
    "SessionStore",
    "SessionSubscription",
    "UnknownSessionError",
    "current_id",
    "uuid7",
]
