"""The committed OpenAPI document is generated from the simulator, kept fresh, and complete."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from prefect_ito.contract import (
    ID_MAX_LENGTH,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    SCHEMA_VERSION,
    ActionKind,
    BookingStatus,
    ErrorCode,
    EventType,
    GateStatus,
    PostTraining,
    QuoteAnswer,
    QuoteState,
    RunState,
    SpendAuthorizationState,
    StageStatus,
)
from prefect_ito.simulator.openapi import DOCUMENT_PATH, openapi_document, render

DOCUMENT = json.loads(DOCUMENT_PATH.read_text(encoding="utf-8"))
OPERATIONS = [
    (method, path, operation)
    for path, operations in DOCUMENT["paths"].items()
    for method, operation in operations.items()
]
ANSWERS = [
    (method, path, status, response)
    for method, path, operation in OPERATIONS
    for status, response in operation["responses"].items()
]


def test_committed_document_is_fresh():
    committed = DOCUMENT_PATH.read_text(encoding="utf-8")

    assert committed == render(), (
        "docs/contract/ito-training-v0.openapi.json is stale: "
        "run `uv run python -m prefect_ito.simulator.openapi`"
    )


def test_document_is_openapi_31_with_the_contract_routes_only():
    document = json.loads(DOCUMENT_PATH.read_text(encoding="utf-8"))

    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/v0/capabilities",
        "/v0/bookings/{booking_id}/training-eligibility",
        "/v0/training-quotes",
        "/v0/training-runs",
        "/v0/training-runs/changes",
        "/v0/training-runs/{run_id}",
        "/v0/training-runs/{run_id}/events",
        "/v0/training-runs/{run_id}/actions/{action_id}/decision",
        "/v0/training-runs/{run_id}/cancel",
        "/v0/auth/device",
        "/v0/auth/token",
        "/v0/auth/revoke",
        "/v0/auth/whoami",
        "/v0/training-quotes/{quote_id}",
        "/v0/training-quotes/{quote_id}/confirmations",
        "/v0/training-quotes/{quote_id}/declines",
        "/v0/spend-authorizations",
        "/v0/spend-authorizations/{authorization_id}",
    }


def test_every_error_response_is_an_envelope():
    document = openapi_document()

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                schema = response["content"]["application/json"]["schema"]["$ref"]
                name = schema.split("/")[-1]
                expected = "Envelope_" if status.startswith("2") else "ErrorEnvelope"
                assert name.startswith(expected), (method, path, status)
                if status == "429":
                    assert "Retry-After" in response["headers"]


def test_no_route_books_buys_or_overrides():
    words = ("book", "reserve", "quote", "purchase", "release", "override")
    document = openapi_document()

    for path, operations in document["paths"].items():
        if path == "/v0/bookings/{booking_id}/training-eligibility":
            assert set(operations) == {"get"}
            continue
        if path == "/v0/training-quotes":
            # Prices a training run on a booking already held (v0.3); it buys nothing, and a
            # submission confirming it is the only thing that creates work.
            assert set(operations) == {"post"}
            continue
        if path.startswith("/v0/training-quotes/{quote_id}"):
            # Reading a quote, and a person's answer to it (v0.4): neither buys anything.
            assert set(operations) <= {"get", "post"}
            continue
        assert not any(word in path for word in words), path


def test_an_independent_validator_accepts_the_committed_document():
    validate(DOCUMENT)  # openapi-spec-validator: OpenAPI 3.1 and its JSON Schema dialect


@pytest.mark.parametrize(("method", "path", "operation"), OPERATIONS, ids=lambda v: str(v)[:40])
def test_every_operation_declares_500(method: str, path: str, operation: dict[str, Any]):
    response = operation["responses"]["500"]
    assert response["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorEnvelope")
    assert "INTERNAL_ERROR" in response["description"]


@pytest.mark.parametrize(("method", "path", "status", "response"), ANSWERS, ids=str)
def test_every_answer_declares_its_headers(
    method: str, path: str, status: str, response: dict[str, Any]
):
    headers = response["headers"]
    assert headers["X-Request-Id"]["required"] is True
    assert headers["Cache-Control"]["required"] is True
    assert headers["Cache-Control"]["schema"]["const"] == "no-store"
    assert {"Deprecation", "Sunset"} <= set(headers)
    if status == "429":
        assert headers["Retry-After"]["required"] is True
    if status == "503":
        assert "Retry-After" in headers


def test_a_replayed_submission_declares_idempotent_replayed():
    responses = DOCUMENT["paths"]["/v0/training-runs"]["post"]["responses"]
    assert responses["200"]["headers"]["Idempotent-Replayed"]["required"] is True
    assert "Idempotent-Replayed" not in responses["201"]["headers"]


def test_envelopes_pin_ok():
    schemas = DOCUMENT["components"]["schemas"]
    successes = [name for name in schemas if name.startswith("Envelope_")]
    assert successes
    for name in successes:
        assert schemas[name]["properties"]["ok"]["const"] is True, name
        assert "ok" in schemas[name]["required"]
    assert schemas["ErrorEnvelope"]["properties"]["ok"]["const"] is False
    assert {"ok", "error"} <= set(schemas["ErrorEnvelope"]["required"])


def _parameter(path: str, method: str, name: str) -> dict[str, Any]:
    parameters = DOCUMENT["paths"][path][method]["parameters"]
    return next(p for p in parameters if p["name"] == name)["schema"]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in schema.get("anyOf", [schema]) if s.get("type") != "null")


def test_booking_id_has_one_length_limit_in_body_path_and_query():
    body = DOCUMENT["components"]["schemas"]["TrainingRunRequest"]["properties"]["booking_id"]
    path = _parameter("/v0/bookings/{booking_id}/training-eligibility", "get", "booking_id")
    query = _nullable(_parameter("/v0/training-runs", "get", "booking_id"))

    assert body["maxLength"] == path["maxLength"] == query["maxLength"] == ID_MAX_LENGTH
    assert body["minLength"] == path["minLength"] == query["minLength"] == 1


def test_idempotency_key_has_one_length_limit_as_header_and_query():
    header = _parameter("/v0/training-runs", "post", "Idempotency-Key")
    query = _nullable(_parameter("/v0/training-runs", "get", "idempotency_key"))
    for path in ("/v0/training-runs/{run_id}/cancel",):
        optional = _nullable(_parameter(path, "post", "Idempotency-Key"))
        assert optional["maxLength"] == IDEMPOTENCY_KEY_MAX_LENGTH
    assert header["maxLength"] == query["maxLength"] == IDEMPOTENCY_KEY_MAX_LENGTH


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``$ref`` and drop the ``null`` branch of an optional member."""
    schema = _nullable(schema)
    while "$ref" in schema:
        schema = _nullable(DOCUMENT["components"]["schemas"][schema["$ref"].split("/")[-1]])
    return schema


def _member(schema: str, *path: str) -> dict[str, Any]:
    node = DOCUMENT["components"]["schemas"][schema]
    for name in path:
        node = _resolve(node)
        node = node["items"] if name == "[]" else node["properties"][name]
    return _resolve(node)


OPEN_ENUMS = [
    # Every enum docs/contract.md calls open ("Extensions and deprecation"), where answers carry it.
    (("TrainingRun", "state"), RunState),
    (("RunChange", "state"), RunState),
    (("Stage", "status"), StageStatus),
    (("Gate", "status"), GateStatus),
    (("RunEvent", "type"), EventType),
    (("PendingAction", "kind"), ActionKind),
    (("TrainingEligibility", "status"), BookingStatus),
    (("Capabilities", "post_training_recipes", "[]"), PostTraining),
    (("ApiError", "code"), ErrorCode),
    (("QuoteConfirmation", "state"), QuoteAnswer),
    (("TrainingQuote", "state"), QuoteState),
    (("QuoteChange", "state"), QuoteState),
    (("SpendAuthorization", "state"), SpendAuthorizationState),
]


@pytest.mark.parametrize(
    ("where", "known"), OPEN_ENUMS, ids=[".".join(where) for where, _ in OPEN_ENUMS]
)
def test_enums_in_answers_are_open(where: tuple[str, ...], known: type[Any]):
    # Before, each was a closed `enum`: a client generated from this document rejected a whole
    # answer holding a value a backend added within v0, which the contract allows.
    schema = _member(*where)

    assert "enum" not in schema
    assert schema["type"] == "string"
    assert schema["x-extensible-enum"] == [member.value for member in known]
    assert "x-extensible-enum" in schema["description"]


def test_a_confirmations_via_is_an_open_string_in_answers():
    schema = _member("ConfirmationRecord", "via")

    assert schema["type"] == "string"
    assert "enum" not in schema


def _referenced(node: Any, seen: set[str]) -> set[str]:
    """Return the component schemas ``node`` refers to, transitively."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        name = ref.split("/")[-1]
        if ref.startswith("#/components/schemas/") and name not in seen:
            seen.add(name)
            _referenced(DOCUMENT["components"]["schemas"][name], seen)
        for value in node.values():
            _referenced(value, seen)
    elif isinstance(node, list):
        for value in node:
            _referenced(value, seen)
    return seen


def test_only_enums_a_client_sends_are_closed():
    requests: set[str] = set()
    for _, _, operation in OPERATIONS:
        _referenced([operation.get("requestBody"), operation.get("parameters")], requests)
    closed = {
        name for name, schema in DOCUMENT["components"]["schemas"].items() if "enum" in schema
    }

    assert closed <= requests, closed - requests
    assert {"DecisionChoice", "PostTraining"} <= closed


def test_the_docs_name_the_contract_version_the_simulator_serves():
    # Before, docs/simulator.md said the simulator served contract v0.1 while it served v0.3.
    version = "v" + SCHEMA_VERSION.removeprefix("ito.training.v")
    docs = DOCUMENT_PATH.parents[1]
    simulator = (docs / "simulator.md").read_text(encoding="utf-8")
    contract = (docs / "contract.md").read_text(encoding="utf-8")

    assert f"contract {version}" in simulator.split("\n\n")[1]
    assert not set(re.findall(r"contract (v0\.[0-9]+)", simulator)) - {version}
    assert f"contract {version}" in contract.splitlines()[0]
    assert DOCUMENT["info"]["version"] == version.removeprefix("v")


def _descriptions(node: Any, where: str = "") -> list[tuple[str, str]]:
    """Return every ``description`` in ``node``, with where it stands."""
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            found.append((where, node["description"]))
        for key, value in node.items():
            found.extend(_descriptions(value, f"{where}/{key}"))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_descriptions(value, f"{where}/{index}"))
    return found


def test_no_description_calls_the_contract_a_draft():
    # Before: `Capabilities.spend_authority` still said "Contract v0.4 (draft)" in v0.4.
    drafts = [where for where, text in _descriptions(DOCUMENT) if "draft" in text.lower()]

    assert drafts == []


def _known_values(schema: dict[str, Any]) -> list[str]:
    """Return the enum values a member may hold (closed or open), through refs and nulls."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "null":
            continue
        resolved = _resolve(branch)
        values = resolved.get("enum") or resolved.get("x-extensible-enum")
        if values:
            return list(values)
    return []


MEMBERS = [
    (f"{name}.{member}", schema)
    for name, component in DOCUMENT["components"]["schemas"].items()
    for member, schema in component.get("properties", {}).items()
    if _known_values(schema)
]


@pytest.mark.parametrize(("where", "schema"), MEMBERS, ids=[where for where, _ in MEMBERS])
def test_a_description_that_lists_an_enums_values_lists_them_all(
    where: str, schema: dict[str, Any]
):
    # Before: `TrainingQuote.state` said "`pending`, `confirmed`, `declined`, `expired` or
    # `used`", without `superseded`: a client written from the document never expected it.
    values = _known_values(schema)
    text = schema.get("description", "")
    named = [value for value in values if f"`{value}`" in text]

    assert len(named) < 2 or named == values, (where, sorted(set(values) - set(named)))
