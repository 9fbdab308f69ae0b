"""The engine as an HTTP service: REST under `/v1` in the resource model of the Agents Protocol v1,
live event streams (Server-Sent Events), problem+json errors, and a Python client.

Needs the `service` extra (Starlette, uvicorn, httpx); nothing below this package imports it, and
this module imports those only when one of its names is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service._app import create_app
    from service._serve import serve
    from service.client import Client, ServiceError

__all__ = ["Client", "ServiceError", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from service._app import create_app

        return create_app
    if name == "serve":
        from service._serve import serve

        return serve
    if name in ("Client", "ServiceError"):
        from service import client

        return getattr(client, name)
    raise AttributeError(f"module 'service' has no attribute {name!r}")
