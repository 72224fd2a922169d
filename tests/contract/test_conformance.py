"""Schemathesis checks a simulator of its own against the committed OpenAPI document.

``wait`` is capped at 1 s and examples are bounded, so the whole check takes seconds. Token
revocation is left out: it would revoke the one token the other operations are checked with.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.simulator.openapi import DOCUMENT_PATH

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _document_with_short_waits():
    document = json.loads(DOCUMENT_PATH.read_text(encoding="utf-8"))
    for path in ("/v0/training-runs/{run_id}", "/v0/training-runs/changes"):
        for parameter in document["paths"][path]["get"]["parameters"]:
            if parameter["name"] == "wait":
                parameter["schema"]["maximum"] = 1
    return document


schema = schemathesis.openapi.from_dict(_document_with_short_waits()).exclude(
    path="/v0/auth/revoke"
)


@pytest.fixture(scope="module")
def live():
    with SimulatorServer(builtin_scenario("default"), time_scale=4e6) as sim:
        yield sim.url, sim.mint_token().get_secret_value()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_simulator_conforms_to_the_committed_document(case, live):
    url, token = live
    case.call_and_validate(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, timeout=10
    )
