"""Malformed answers from a backend, in the middle of supervising a real run.

A tap between the client and the simulator rewrites answers the way a broken or newer backend
would: values no enum of this prefect-ito knows, missing or mistyped fields, a body that is not
JSON, a run version that goes backwards, an event log that repeats or skips events, an error code
nobody documented, and a long-poll that never answers. Each ends supervision with a clear outcome
(an :class:`~prefect_ito.exceptions.ItoError` whose state and exit code the docs list) or is
handled as the contract's extension rules say — never with another exception, and never with a
report that says more than the backend did. (Fuzzed bodies are fed to the response parser by
``tests/backend/test_parser_fuzz.py``.)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from reliability_kit import Backend, request_for
from transports import Rewrite, Tap

from prefect_ito.backend import client as client_module
from prefect_ito.backend import operations
from prefect_ito.backend.operations import STEP_RETRY_DELAYS_SECONDS
from prefect_ito.contract import RunState, TrainingRun
from prefect_ito.exceptions import ItoError
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.outcomes import raise_for_outcome
from prefect_ito.supervision.plain import ClientSteps

RUN = re.compile(r"^/v0/training-runs/run_[0-9a-f]+$")
EVENTS = re.compile(r"^/v0/training-runs/run_[0-9a-f]+/events$")


class Recording(ClientSteps):
    """Plain supervision steps that remember every sequence number a report reached."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[int] = []

    async def report(self, run: TrainingRun, after_seq: int) -> int:
        seq = await super().report(run, after_seq)
        self.seen.append(seq)
        return seq


def once(path: re.Pattern[str], change: Callable[[dict[str, Any]], Any]) -> Rewrite:
    """Rewrite the first successful answer on ``path`` whose data ``change`` alters."""
    done = False

    def rewrite(request: httpx.Request, body: dict[str, Any]) -> Any:
        nonlocal done
        if done or not path.match(request.url.path) or not body.get("ok"):
            return None
        changed = change(body["data"])
        if changed is None:
            return None
        done = True
        return changed if isinstance(changed, bytes | httpx.Response) else {**body, "data": changed}

    return rewrite


def every(path: re.Pattern[str], change: Callable[[dict[str, Any]], Any]) -> Rewrite:
    """Rewrite every successful answer on ``path``."""

    def rewrite(request: httpx.Request, body: dict[str, Any]) -> Any:
        if not path.match(request.url.path) or not body.get("ok"):
            return None
        return {**body, "data": change(body["data"])}

    return rewrite


def when(current: str, **changes: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda run: {**run, **changes} if run["state"] == current else None


def without(field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda run: {k: v for k, v in run.items() if k != field} if run["version"] > 2 else None


def older_than_asked(request: httpx.Request, body: dict[str, Any]) -> Any:
    """Answer a long-poll past version V with version V - 1: the version went backwards."""
    asked = request.url.params.get("after_version")
    if not (RUN.match(request.url.path) and asked and int(asked) > 2 and body.get("ok")):
        return None
    return {**body, "data": {**body["data"], "version": int(asked) - 1}}


def repeated(page: dict[str, Any]) -> dict[str, Any]:
    return {**page, "events": [e for e in page["events"] for _ in (0, 1)]}


def skipping(page: dict[str, Any]) -> dict[str, Any]:
    return {**page, "events": page["events"][::2]}


def renamed_types(page: dict[str, Any]) -> dict[str, Any]:
    return {**page, "events": [{**e, "type": e["type"] + "_v2"} for e in page["events"]]}


def undocumented_error(run: dict[str, Any]) -> Any:
    if run["version"] <= 2:
        return None
    error = {"code": "QUOTA_MELTED", "message": "the quota melted", "field": None}
    return httpx.Response(409, json={"ok": False, "live_api_contacted": False, "error": error})


CASES: dict[str, tuple[Rewrite, str]] = {
    "unknown run state, not terminal": (once(RUN, when("running", state="quiesced")), "Succeeded"),
    "unknown run state, terminal": (
        once(RUN, when("succeeded", state="archived", terminal=True)),
        "RunFailed",
    ),
    "unknown event types": (every(EVENTS, renamed_types), "Succeeded"),
    "missing field": (once(RUN, without("stages")), "ProtocolError"),
    "mistyped field": (once(RUN, lambda run: {**run, "version": "seven"}), "ProtocolError"),
    "body not JSON": (once(RUN, lambda run: b"<html>Bad Gateway</html>"), "ProtocolError"),
    "version goes backwards": (older_than_asked, "ProtocolError"),
    "event log repeats": (every(EVENTS, repeated), "Succeeded"),
    "event log skips": (every(EVENTS, skipping), "Succeeded"),
    "undocumented error code": (once(RUN, undocumented_error), "BackendError"),
}


async def supervise_through(
    target: Backend, submit: Any, tap: Tap, **options: Any
) -> tuple[str, Recording]:
    """Submit a run, then supervise it through ``tap``; return how supervision ended."""
    logger = logging.getLogger("tests.reliability.malformed")
    async with target.client(transport=tap, max_retries=1, **options) as client:
        run = await submit(client, request_for("bk-h200-2x8-ib"), "malformed")
        steps = Recording(client, SupervisionParameters(), logger)
        try:
            final = await supervision.supervise(steps, run)
            raise_for_outcome(final)
        except ItoError as error:
            return error.state_name, steps
    return final.state.value.capitalize(), steps


@pytest.mark.parametrize("case", list(CASES))
async def test_a_malformed_answer_ends_clearly_or_is_handled_as_documented(
    case, backend, submit, ledger, prefect_server, sweep
):
    rewrite, expected = CASES[case]
    target: Backend = backend()
    tap = Tap(rewrite=rewrite)

    outcome, steps = await supervise_through(target, submit, tap)

    ledger.record(
        "malformed-answers",
        trials=1,
        faults={case: tap.outcomes["rewritten"]},
        outcomes={outcome: 1},
    )
    assert tap.outcomes["rewritten"] >= 1
    assert outcome == expected
    assert steps.seen == sorted(steps.seen)  # the events relayed never went back
    (admin,) = target.sim.runs()
    async with target.client() as client:
        last_seq = (await client.list_events(admin.run.run_id)).last_seq
    assert steps.seen[-1] <= last_seq  # nothing relayed past what the backend logged
    if outcome == "Succeeded":
        assert admin.run.state is RunState.SUCCEEDED  # and it did succeed


async def test_a_long_poll_that_never_answers_ends_as_unreachable(
    backend, submit, ledger, prefect_server, monkeypatch
):
    # A long-poll's read timeout is the longer of the client's and its wait plus a margin: keep
    # both short here (1 s, and the tests' 1 s wait plus 0.5 s).
    monkeypatch.setattr(client_module, "LONG_POLL_MARGIN_SECONDS", 0.5)
    # The step's own retries are counted below, not timed: as many, without the 2 s and 10 s.
    monkeypatch.setattr(
        operations, "STEP_RETRY_DELAYS_SECONDS", (0.1,) * len(STEP_RETRY_DELAYS_SECONDS)
    )
    target: Backend = backend("stall")
    tap = Tap(never_answer=r"^/v0/training-runs/run_[0-9a-f]+$")

    outcome, _ = await supervise_through(target, submit, tap, timeout=httpx.Timeout(1.0))

    ledger.record(
        "malformed-answers",
        trials=1,
        faults={"long-poll never answers": tap.outcomes["never answered"]},
        outcomes={outcome: 1},
    )
    assert outcome == "BackendUnreachable"
    # The client's first attempt and its one retry, in each try of the step (the flow's tasks
    # and ItoTrainingRun retry a step alike).
    assert tap.outcomes["never answered"] == 2 * (1 + len(STEP_RETRY_DELAYS_SECONDS))
