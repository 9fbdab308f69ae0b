"""The session viewer: a read-only page served at `/` with its static files under `/viewer/`, and
the few read endpoints it needs under `/v1/viewer/` (behind the same credentials as the API).

The page and its files are public (they hold no data); every byte of session data comes from the
JSON API with the credential the person pasted. Nothing here writes to the store.
"""

from __future__ import annotations

from service.viewer._api import ROUTES as API_ROUTES
from service.viewer._pages import ROUTES as PAGE_ROUTES
from service.viewer._pages import is_public

ROUTES = [*PAGE_ROUTES, *API_ROUTES]

__all__ = ["ROUTES", "is_public"]
