"""Property-based run of the OpenAPI document against a live server (schemathesis): whatever the
generated request, the server never answers 500, and every answer has a documented status, the
documented media type and a body matching its schema. Bounded in examples so CI stays quick."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests._service import Server

DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
EXAMPLES = {"ci": 12, "deep": 200}.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), 8)

schemathesis.serializer.alias("application/jsonl", "text/plain")  # seeding takes JSON lines
schema = schemathesis.openapi.from_path(DOCUMENT).exclude(path_regex=r"/stream$")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("schema") / "store").start()
    with running.client() as admin:  # something for the generated ids to find
        admin.open_session("s", title="t")
        admin.inject("s", {"role": "user", "content": "hi"})
    yield running
    running.kill()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_document_holds_against_the_server(case: schemathesis.Case, server: Server) -> None:
    headers = {"authorization": f"Bearer {server.admin_key}"}
    case.call_and_validate(base_url=server.url, headers=headers, checks=CHECKS, timeout=30)
