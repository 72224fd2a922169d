"""Forward compatibility: values a newer backend adds are kept, logged once, and treated safely."""

from __future__ import annotations

import json
import logging
import pickle
from typing import Any

import httpx
import pytest
from ito_fakes import NOW, Script, mock_client, ok, sample_run

from prefect_ito import exceptions as exc
from prefect_ito.backend.desk import verify_booking
from prefect_ito.backend.gates import gate_settled
from prefect_ito.contract import (
    ActionKind,
    BookingStatus,
    Capabilities,
    EventPage,
    EventType,
    Gate,
    GateStatus,
    RunOutcome,
    RunState,
    Stage,
    StageStatus,
    TrainingEligibility,
    TrainingRun,
)
from prefect_ito.contract.open_enum import UNKNOWN
from prefect_ito.parameters import BookingClaim, SupervisionParameters
from prefect_ito.reporting.report import progress_percent, relay_events, stage_changes
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.outcomes import raise_for_outcome
from prefect_ito.supervision.plain import ClientSteps

OPEN_ENUMS = [RunState, StageStatus, EventType, ActionKind, GateStatus, BookingStatus]


def run_with(**changes: Any) -> TrainingRun:
    """Return the sample run as the backend would send it, with fields changed, parsed."""
    return TrainingRun.model_validate(sample_run().model_dump(mode="json") | changes)


def event(seq: int, kind: str) -> dict[str, Any]:
    return {"seq": seq, "run_id": "run-1", "type": kind, "at": NOW.isoformat(), "message": kind}


@pytest.mark.parametrize("enum", OPEN_ENUMS, ids=lambda enum: enum.__name__)
def test_an_unknown_value_is_kept_as_unknown_with_its_raw_value(enum: type) -> None:
    member = enum("added_by_a_newer_backend")

    assert isinstance(member, enum)
    assert (member.known, member.name, member.value) == (
        False,
        UNKNOWN,
        "added_by_a_newer_backend",
    )
    assert member == "added_by_a_newer_backend"
    assert member not in list(enum)
    assert pickle.loads(pickle.dumps(member)) == member  # Prefect pickles results
    assert all(known.known for known in enum)
    with pytest.raises(ValueError, match="is not a valid"):
        enum(7)


def test_the_document_still_lists_only_the_values_prefect_ito_knows() -> None:
    schema = TrainingRun.model_json_schema()
    # An open enum: the known values are listed, and a plain string admits any other.
    run_state = schema["$defs"]["RunState"]
    assert run_state["x-extensible-enum"] == [state.value for state in RunState]
    assert run_state["type"] == "string" and "enum" not in run_state


def test_an_unknown_value_is_logged_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prefect_ito.contract"):
        for _ in range(3):
            run_with(state="logged_once_state")

    records = [r for r in caplog.records if "logged_once_state" in r.getMessage()]
    assert len(records) == 1
    assert "RunState" in records[0].getMessage()


async def test_an_events_page_with_an_unknown_type_is_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = {
        "events": [event(1, "run_accepted"), event(2, "gpu_swapped"), event(3, "run_finished")],
        "last_seq": 3,
    }
    async with mock_client(Script(ok(page))) as client:
        read = await client.list_events("run-1")
    emitted: list[str] = []
    monkeypatch.setattr(
        "prefect_ito.reporting.report.emit_event", lambda event, **_: emitted.append(event)
    )

    last = relay_events(sample_run(), read.events)

    assert [e.type.value for e in read.events] == ["run_accepted", "gpu_swapped", "run_finished"]
    assert not read.events[1].type.known
    assert emitted == ["ito.training.submitted", "ito.training.finished"]  # the unknown skipped
    assert last == 3


def test_a_run_in_an_unknown_state_has_not_finished_unless_the_backend_says_so() -> None:
    assert run_with(state="paused_by_operator").finished is False
    assert run_with(state="paused_by_operator", terminal=False).finished is False
    assert run_with(state="paused_by_operator", terminal=True).finished is True
    # A state prefect-ito knows is read as such, whatever the (v0.1) field says.
    assert run_with(state="succeeded").finished is True
    assert run_with(state="running", terminal=True).finished is False


def test_a_run_that_ended_in_an_unknown_state_is_no_success() -> None:
    outcome = RunOutcome(code="PREEMPTED", message="the provider took the nodes back")
    run = run_with(state="preempted", terminal=True, outcome=outcome.model_dump())

    with pytest.raises(exc.RunFailed, match=r"'preempted'.*PREEMPTED"):
        raise_for_outcome(run)


def test_an_unknown_stage_status_is_not_done_and_reported_once() -> None:
    stage = {"name": "pretrain", "status": "warming_up"}
    before, after = run_with(stages=[stage]), run_with(stages=[stage])

    assert progress_percent(after) == 0.0
    assert stage_changes(None, after) == ["Stage pretrain: warming_up"]
    assert stage_changes(before, after) == []  # the same unknown status is no change


def test_an_unknown_gate_status_is_no_result_to_stop_waiting_for() -> None:
    gate = Gate(battery="core", status=GateStatus("re_evaluating"))
    stage = Stage(name="pretrain", status=StageStatus.RUNNING, gate=gate)
    run = run_with(state="running", current_stage="pretrain", stages=[stage.model_dump()])

    assert gate_settled(run, "pretrain") is False


async def test_capabilities_skip_a_recipe_they_do_not_know() -> None:
    answer = {
        "training_run": {"live": True},
        "post_training_recipes": ["sft", "orpo", "dpo"],
        "long_poll": True,
    }
    async with mock_client(Script(ok(answer))) as client:
        capabilities = await client.get_capabilities()

    assert [recipe.value for recipe in capabilities.post_training_recipes] == ["sft", "dpo"]
    assert isinstance(capabilities, Capabilities)


async def test_a_booking_in_an_unknown_status_may_not_train() -> None:
    eligibility = TrainingEligibility(
        booking_id="bk-1",
        status=BookingStatus("migrating"),
        gpu_sku="H200",
        node_count=2,
        gpus_per_node=8,
        fabric="InfiniBand",
        region="eu",
        term_end=NOW,
        eligible=True,
    )
    async with mock_client(Script(ok(eligibility))) as client:
        with pytest.raises(exc.BookingNotEligible, match="migrating"):
            await verify_booking(client, BookingClaim(booking_id="bk-1"))


def test_a_loss_spike_restart_must_carry_its_context() -> None:
    action = {
        "action_id": "act-1",
        "kind": "loss_spike_restart",
        "stage": "pretrain",
        "step": 10,
        "proposed_at": NOW.isoformat(),
    }
    with pytest.raises(ValueError, match="loss, baseline_loss, proposed_checkpoint"):
        run_with(state="awaiting_decision", pending_action=action)


class Backend:
    """A MockTransport handler: the run's successive reads, and an empty event log."""

    def __init__(self, *reads: TrainingRun) -> None:
        self.reads = list(reads)
        self.run_reads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return ok(EventPage(events=[], last_seq=0))
        self.run_reads += 1
        return ok(self.reads.pop(0) if len(self.reads) > 1 else self.reads[0])


async def _supervise(backend: Backend, first: TrainingRun, logger: logging.Logger) -> TrainingRun:
    async with mock_client(Script(backend)) as client:
        steps = ClientSteps(client, SupervisionParameters(), logger)
        return await supervision.supervise(steps, first)


async def test_supervision_follows_a_run_in_an_unknown_state_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Backend(
        run_with(state="paused_by_operator", version=2),
        run_with(state="running", version=3),
        run_with(state="succeeded", version=4, terminal=True),
    )
    logger = logging.getLogger("test.supervision.unknown-state")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        final = await _supervise(backend, run_with(state="paused_by_operator"), logger)

    assert final.state is RunState.SUCCEEDED
    assert backend.run_reads == 3  # it kept long-polling through the unknown state
    warnings = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(warnings) == 1 and "'paused_by_operator'" in warnings[0]


async def test_an_action_of_an_unknown_kind_is_not_put_to_a_person(
    caplog: pytest.LogCaptureFixture,
) -> None:
    action = {
        "action_id": "act-9",
        "kind": "raise_budget",
        "stage": "pretrain",
        "step": 10,
        "proposed_at": NOW.isoformat(),
        "proposed_budget_usd": 2000,
    }
    waiting = run_with(state="awaiting_decision", pending_action=action)
    backend = Backend(
        run_with(state="awaiting_decision", pending_action=action, version=2),
        run_with(state="succeeded", version=3),
    )
    logger = logging.getLogger("test.supervision.unknown-action")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        # Outside a flow run, putting an action to a person raises DecisionRequired instead.
        final = await _supervise(backend, waiting, logger)

    assert waiting.pending_action is not None
    assert waiting.pending_action.kind.value == "raise_budget"
    assert final.state is RunState.SUCCEEDED
    warnings = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(warnings) == 1 and "'raise_budget'" in warnings[0]


def test_an_unknown_value_in_a_response_body_survives_a_json_round_trip() -> None:
    run = run_with(state="paused_by_operator")
    assert json.loads(run.model_dump_json())["state"] == "paused_by_operator"


@pytest.mark.parametrize(
    ("version", "readable"),
    [
        ("ito.training.v0", True),  # a v0 backend: v0.1 only added to it
        ("ito.training.v0.1", True),
        ("ito.training.v0.7", True),  # a later minor version adds only what we may ignore
        ("ito.training.v1", False),
        ("ito.training.v0.x", False),
    ],
)
async def test_capabilities_of_any_v0_minor_version_read(version: str, readable: bool) -> None:
    answer = {
        "schema_version": version,
        "training_run": {"live": True},
        "post_training_recipes": [],
        "long_poll": True,
    }
    async with mock_client(Script(ok(answer))) as client:
        if readable:
            assert (await client.get_capabilities()).schema_version == version
        else:
            with pytest.raises(exc.ItoProtocolError) as caught:
                await client.get_capabilities()
            assert caught.value.field == "data.schema_version"


async def test_the_client_says_which_contract_version_it_speaks() -> None:
    script = Script(ok(sample_run()))
    async with mock_client(script) as client:
        await client.get_training_run("run-1")

    assert script.requests[0].headers["User-Agent"] == "prefect-ito (ito.training.v0.5)"
