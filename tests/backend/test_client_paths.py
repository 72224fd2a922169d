"""Ids go into URL paths as one segment each: an id that would change the route is never sent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ito_fakes import Script, mock_client, ok, sample_run

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import DecisionChoice, DecisionRequest
from prefect_ito.exceptions import ExitCode, InvalidParameters

DECISION = DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="Ada", reason="ok")
Call = Callable[[ItoClient, str], Awaitable[Any]]
CALLS: dict[str, tuple[Call, str]] = {
    "get_training_run": (lambda c, i: c.get_training_run(i), "/v0/training-runs/{}"),
    "list_events": (lambda c, i: c.list_events(i), "/v0/training-runs/{}/events"),
    "cancel_training_run": (
        lambda c, i: c.cancel_training_run(i, idempotency_key="k-1"),
        "/v0/training-runs/{}/cancel",
    ),
    "decide (run)": (
        lambda c, i: c.decide(i, "act-1", DECISION, idempotency_key="k-1"),
        "/v0/training-runs/{}/actions/act-1/decision",
    ),
    "decide (action)": (
        lambda c, i: c.decide("run-1", i, DECISION, idempotency_key="k-1"),
        "/v0/training-runs/run-1/actions/{}/decision",
    ),
    "get_training_eligibility": (
        lambda c, i: c.get_training_eligibility(i),
        "/v0/bookings/{}/training-eligibility",
    ),
}
PATH_CHANGING = ["", ".", "..", "run/1", "../capabilities", "run?x=1", "run#top", "run\\1"]


@pytest.mark.parametrize("value", PATH_CHANGING)
@pytest.mark.parametrize("name", list(CALLS))
async def test_an_id_that_would_change_the_path_is_refused_before_sending(name, value):
    # Before, '' reached GET /v0/training-runs/ (a redirect), '..' the list of runs, and
    # 'run/1' a route that does not exist.
    call, _ = CALLS[name]
    script = Script(ok(sample_run().model_dump(mode="json")))
    async with mock_client(script) as client:
        with pytest.raises(InvalidParameters) as refused:
            await call(client, value)

    assert script.requests == []
    assert refused.value.exit_code == ExitCode.INVALID_INPUT
    assert refused.value.field in {"run_id", "action_id", "booking_id"}
    assert str(refused.value).startswith(f"{refused.value.field}: ")


@settings(max_examples=150, deadline=None)
@given(value=st.text(max_size=20), name=st.sampled_from(list(CALLS)))
async def test_any_id_reaches_its_own_route_or_is_refused(value, name):
    call, template = CALLS[name]
    script = Script(ok(sample_run().model_dump(mode="json")))
    async with mock_client(script, max_retries=0) as client:
        try:
            await call(client, value)
        except InvalidParameters:
            assert script.requests == []
            return
        except Exception:  # the answer may not fit the call: only the path is checked here
            pass

    (request,) = script.requests
    # A server routes on the decoded path: the id must still be exactly one ordinary segment.
    decoded = unquote(request.url.raw_path.decode("ascii").split("?")[0])
    assert decoded.split("/") == template.format(value).split("/"), decoded
    assert value not in ("", ".", "..") and not set(value) & set("/\\?#"), decoded
