"""The committed OpenAPI document is generated from the simulator and kept fresh."""

from __future__ import annotations

import json

from prefect_ito.simulator.openapi import DOCUMENT_PATH, openapi_document, render


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
    }


def test_every_error_response_is_an_envelope():
    document = openapi_document()

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                schema = response["content"]["application/json"]["schema"]["$ref"]
                assert schema.split("/")[-1].startswith("Envelope"), (method, path, status)
                if status == "429":
                    assert "Retry-After" in response["headers"]


def test_no_route_books_buys_or_overrides():
    words = ("book", "reserve", "quote", "purchase", "release", "override")
    document = openapi_document()

    for path, operations in document["paths"].items():
        if path == "/v0/bookings/{booking_id}/training-eligibility":
            assert set(operations) == {"get"}
            continue
        assert not any(word in path for word in words), path
