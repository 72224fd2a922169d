"""Fuzz the response parser: each body ends in a model, a protocol error or a mapped API error."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from ito_fakes import envelope, sample_run
from pydantic import ValidationError

from prefect_ito.backend._http import parse_response
from prefect_ito.contract import (
    ApiError,
    Envelope,
    ErrorCode,
    ErrorEnvelope,
    Revocation,
    TrainingRun,
)
from prefect_ito.exceptions import ItoAPIError, ItoProtocolError, error_from_envelope

ENDPOINT = "GET /v0/fuzz"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
error_envelopes = st.builds(
    lambda code, message, field: envelope(error={"code": code, "message": message, "field": field}),
    st.sampled_from(list(ErrorCode)).map(str) | st.text(max_size=12),
    st.text(max_size=30) | st.integers(),
    st.none() | st.text(max_size=8),
)
near_envelopes = st.fixed_dictionaries(
    {"ok": st.booleans() | json_values, "live_api_contacted": st.booleans()},
    optional={
        "data": json_values,
        "error": json_values | error_envelopes.map(lambda e: e["error"]),
    },
)
statuses = st.sampled_from([200, 201, 400, 401, 404, 409, 418, 422, 429, 500, 502, 503])


def _expected_error(body: Any) -> type[ItoAPIError] | None:
    """Return the class a valid error envelope must map to, or None if it is not one."""
    try:
        parsed = ErrorEnvelope.model_validate(body)
    except ValidationError:
        return None
    return type(error_from_envelope(parsed.error.code.value, parsed.error.message))


def _outcome(response: httpx.Response, model: type[Any]) -> Any:
    """Return the parsed model or the prefect-ito error raised; anything else escapes the test."""
    try:
        return parse_response(response, model, ENDPOINT)
    except (ItoProtocolError, ItoAPIError) as error:
        return error


def _check(body_bytes: bytes, status: int, model: type[Any]) -> None:
    try:
        body = json.loads(body_bytes)
    except ValueError:
        body = None
    expected = _expected_error(body)
    outcome = _outcome(httpx.Response(status, content=body_bytes), model)
    if isinstance(outcome, ItoProtocolError):
        assert outcome.endpoint == ENDPOINT
        assert expected is None
    elif isinstance(outcome, ItoAPIError):
        assert isinstance(body, dict)
        assert body.get("ok") is not True or status >= 400
        assert expected is None or type(outcome) is expected
    else:
        assert status < 400
        assert isinstance(outcome, model)
        assert Envelope[model].model_validate(body).data == outcome


@settings(max_examples=300, deadline=None)
@given(body=json_values | near_envelopes | error_envelopes, status=statuses)
def test_arbitrary_json_never_escapes_the_error_tree(body: Any, status: int) -> None:
    _check(json.dumps(body).encode(), status, Revocation)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), status=statuses)
def test_truncated_bodies_are_protocol_errors(data: st.DataObject, status: int) -> None:
    whole = json.dumps(envelope(sample_run())).encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(whole) - 1))
    outcome = _outcome(httpx.Response(status, content=whole[:cut]), TrainingRun)
    assert isinstance(outcome, ItoProtocolError)
    assert outcome.endpoint == ENDPOINT


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64), status=statuses)
def test_arbitrary_bytes_never_escape_the_error_tree(raw: bytes, status: int) -> None:
    _check(raw, status, TrainingRun)


@given(code=st.sampled_from(list(ErrorCode)), message=st.text(max_size=40))
def test_valid_error_envelopes_map_to_their_class(code: ErrorCode, message: str) -> None:
    body = envelope(error=ApiError(code=code, message=message).model_dump(mode="json"))
    outcome = _outcome(httpx.Response(400, json=body), TrainingRun)
    assert type(outcome) is type(error_from_envelope(code.value, message))
    assert (outcome.code, outcome.message) == (code.value, message)
