"""The viewer's static files: `/` is the page, `/viewer/<name>` its modules and stylesheet.

Only the files shipped in `static/` are served, each by its exact name; every answer carries a
Content-Security-Policy that allows scripts, styles and requests from this origin only (no inline
script, no framing, no other host), so transcript text can never run as code even if it slipped
past the page's escaping.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
    "cross-origin-opener-policy": "same-origin",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
PREFIX = "/viewer/"


def is_public(path: str) -> bool:
    """Whether `path` is one of the viewer's files, which need no credential."""
    return path == "/" or (path.startswith(PREFIX) and _file(path[len(PREFIX) :]) is not None)


@cache
def _files() -> dict[str, bytes]:
    """Every shipped file by name, read once."""
    folder = resources.files(__package__).joinpath("static")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and any(entry.name.endswith(s) for s in _TYPES)
    }


def _file(name: str) -> bytes | None:
    return _files().get(name)


def _answer(name: str) -> Response:
    body = _file(name)
    if body is None:
        return Response(b"not found", status_code=404, media_type="text/plain", headers=HEADERS)
    kind = _TYPES["." + name.rsplit(".", 1)[-1]]
    return Response(body, media_type=kind, headers=HEADERS)


async def page(request: Request) -> Response:
    return _answer("index.html")


async def asset(request: Request) -> Response:
    name: str = request.path_params["name"]
    return _answer(name)


ROUTES = [
    Route("/", page, methods=["GET"]),
    Route(PREFIX + "{name}", asset, methods=["GET"]),
]
