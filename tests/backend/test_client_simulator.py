"""Contract tests: ItoClient against the reference simulator over loopback TCP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from ito_fakes import Sleeps, sample_request
from pydantic import SecretStr
from simulator_fixture import with_faults

from prefect_ito import exceptions as exc
from prefect_ito.backend._retry import RetryBudget
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import (
    ALL_SCOPES,
    DecisionChoice,
    DecisionRequest,
    RunState,
    TrainingRequest,
    TrainingRunRequest,
)
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.scenario import Faults, SimBooking

COMPLETED = "bk-h200-2x8-ib"


def _client(sim: Any, token: SecretStr | None = None, **options: Any) -> ItoClient:
    options.setdefault("sleep", Sleeps())
    # A person's token: these tests confirm their own quotes at the backend.
    person = sim.mint_token(scopes=[scope.value for scope in ALL_SCOPES], principal="user:ada")
    return ItoClient(sim.url, token if token is not None else person, **options)


def _v0(sim: Any) -> list[Any]:
    """Return the contract requests the simulator answered, but for quotes and their
    confirmations (which create no run)."""
    return [
        entry
        for entry in sim.requests()
        if entry.path.startswith("/v0/") and not entry.path.startswith("/v0/training-quotes")
    ]


async def _confirmed(client: ItoClient, request: TrainingRunRequest) -> TrainingRunRequest:
    """Return ``request`` naming a fresh quote for it, confirmed by a person at the backend."""
    quote = await client.quote_training_run(request)
    await client.confirm_quote(quote.quote_id, idempotency_key=f"confirm-{quote.quote_id}")
    return request.spending(quote.quote_id)


async def test_happy_path_reads_and_submission(sim: Any) -> None:
    # Slow enough that the run is still active when listed, however busy the machine: at the
    # default scale it ends in seconds, and a starved test once listed it after its end.
    sim.load_scenario(builtin_scenario("default").with_options(time_scale=1_000))
    async with _client(sim) as client:
        capabilities = await client.get_capabilities()
        eligibility = await client.get_training_eligibility(COMPLETED)
        confirmed = await _confirmed(client, sample_request(COMPLETED))
        first = await client.submit_training_run(confirmed, idempotency_key="k-a")
        # A replay needs no confirmation: the run exists.
        again = await client.submit_training_run(sample_request(COMPLETED), idempotency_key="k-a")
        found = await client.find_run_by_idempotency_key("k-a")
        active = await client.list_active_runs(COMPLETED)
        events = await client.list_events(first.run.run_id)
        me = await client.whoami()
    assert capabilities.training_run.live
    assert eligibility.eligible
    assert (first.replayed, again.replayed) == (False, True)
    assert again.run.run_id == first.run.run_id
    assert found is not None
    assert found.run_id == first.run.run_id
    assert first.run.run_id in {run.run_id for run in active}
    assert events.last_seq >= 1
    assert me.account == "sim-user"
    assert await _find_missing(sim, "k-missing") is None


async def _find_missing(sim: Any, key: str) -> Any:
    async with _client(sim) as client:
        return await client.find_run_by_idempotency_key(key)


async def test_long_poll_returns_a_newer_version(sim: Any) -> None:
    async with _client(sim) as client:
        confirmed = await _confirmed(client, sample_request(COMPLETED))
        run = (await client.submit_training_run(confirmed, idempotency_key="k-lp")).run
        newer = await client.get_training_run(run.run_id, after_version=run.version, wait=30)
    assert newer.version > run.version


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.get_training_eligibility("bk-nope"), exc.BookingNotFound),
        (lambda c: c.get_training_run("run-nope"), exc.RunNotFound),
        (lambda c: c.list_events("run-nope"), exc.RunNotFound),
        (lambda c: c.exchange_device_code("dev-nope"), exc.ExpiredToken),
        (
            lambda c: c.submit_training_run(
                TrainingRunRequest.model_construct(
                    **(sample_request(COMPLETED).model_dump() | {"budget_usd": -1.0})
                ),
                idempotency_key="k-bad",
            ),
            exc.ValidationFailed,
        ),
    ],
)
async def test_error_answers_map_to_their_classes(
    sim: Any, call: Any, error: type[exc.ItoAPIError]
) -> None:
    async with _client(sim) as client:
        with pytest.raises(error) as caught:
            await call(client)
    assert caught.value.request_id
    assert len(_v0(sim)) == 1  # none of these is retried


async def test_expired_booking_is_not_eligible(sim: Any) -> None:
    expired = next(b.booking_id for b in sim_bookings(sim) if b.status == "expired")
    async with _client(sim) as client:
        assert not (await client.get_training_eligibility(expired)).eligible
        with pytest.raises(exc.BookingNotEligible):
            await client.submit_training_run(sample_request(expired), idempotency_key="k-exp")


def sim_bookings(sim: Any) -> list[SimBooking]:
    body = httpx.get(f"{sim.url}/_sim/bookings").json()
    return [SimBooking.model_validate(b) for b in body["data"]]


async def test_key_reuse_and_busy_booking_are_final(sim: Any) -> None:
    other = TrainingRequest(
        booking_id=COMPLETED, model_size="8B", data_refs=["s3://x"], target="t", budget_usd=5.0
    ).to_submission()
    async with _client(sim) as client:
        confirmed = await _confirmed(client, sample_request(COMPLETED))
        await client.submit_training_run(confirmed, idempotency_key="k-1")
        with pytest.raises(exc.IdempotencyKeyReused):
            await client.submit_training_run(other, idempotency_key="k-1")
        with pytest.raises(exc.BookingBusy):
            await client.submit_training_run(other, idempotency_key="k-2")
    assert [e.status for e in _v0(sim)] == [201, 409, 409]


async def test_scaffold_refuses_training() -> None:
    from prefect_ito.simulator import SimulatorServer

    with SimulatorServer(scaffold=True) as sim:
        async with _client(sim) as client:
            assert not (await client.get_capabilities()).training_run.live
            with pytest.raises(exc.CapabilityNotAvailable):
                await client.submit_training_run(sample_request(COMPLETED), idempotency_key="k")


async def test_unauthenticated_and_revoked_tokens_stop_at_once(sim: Any) -> None:
    async with ItoClient(sim.url, SecretStr("not-a-token"), sleep=Sleeps()) as client:
        with pytest.raises(exc.Unauthenticated):
            await client.get_capabilities()
    assert [e.status for e in _v0(sim)] == [401]
    token = sim.mint_token()
    sim.load_scenario(with_faults(revoke_tokens_after_seconds=0))
    async with _client(sim, token) as client:
        with pytest.raises(exc.TokenRevoked):
            await client.get_training_run("run-1")
    assert [e.status for e in _v0(sim)] == [401]


async def test_unavailable_backend_is_retried_until_the_retries_run_out(sim: Any) -> None:
    sim.load_scenario(with_faults(unavailable_rate=1.0))
    sleeps = Sleeps()
    async with _client(sim, max_retries=2, sleep=sleeps) as client:
        with pytest.raises(exc.BackendUnavailable):
            await client.get_capabilities()
    assert [e.status for e in _v0(sim)] == [503, 503, 503]
    assert len(sleeps.delays) == 2


async def test_rate_limit_honours_retry_after(sim: Any) -> None:
    sim.load_scenario(with_faults(rate_limited_rate=1.0, retry_after_seconds=2))
    sleeps = Sleeps()
    async with _client(sim, max_retries=1, sleep=sleeps) as client:
        with pytest.raises(exc.RateLimited) as caught:
            await client.get_capabilities()
    assert caught.value.retry_after == 2.0
    assert sleeps.delays == [2.0]


async def test_flaky_backend_is_ridden_out(sim: Any) -> None:
    sim.load_scenario(
        with_faults(unavailable_rate=0.3, rate_limited_rate=0.2, seed=7, retry_after_seconds=0)
    )
    budget = RetryBudget(capacity=100)
    async with _client(sim, max_retries=8, retry_budget=budget) as client:
        confirmed = await _confirmed(client, sample_request(COMPLETED))
        await client.submit_training_run(confirmed, idempotency_key="k-same")
        for _ in range(10):
            await client.get_capabilities()
    statuses = [e.status for e in _v0(sim)]
    assert {503, 429} & set(statuses)
    assert statuses.count(201) == 1


async def test_dropped_answers_never_duplicate_a_run() -> None:
    from prefect_ito.simulator import SimulatorServer

    bookings = [SimBooking(booking_id=f"bk-drop-{n}", status="completed") for n in range(50)]
    scenario = builtin_scenario("default").model_copy(
        update={"bookings": bookings, "faults": Faults(drop_response_after_commit=50)}
    )
    with SimulatorServer(scenario=scenario) as sim:
        async with _client(sim, max_retries=3) as client:
            confirmed = [
                await _confirmed(client, sample_request(f"bk-drop-{n}")) for n in range(50)
            ]
            submissions = await asyncio.gather(
                *(
                    client.submit_training_run(request, idempotency_key=f"k-drop-{n}")
                    for n, request in enumerate(confirmed)
                )
            )
        runs = sim.runs()
        posts = [e for e in _v0(sim) if e.method == "POST"]
    assert all(s.replayed for s in submissions)
    assert len(runs) == 50
    assert len({run.idempotency_key for run in runs}) == 50
    # Each lost answer was resolved by a lookup by key, never by a second POST.
    assert len(posts) == 50
    assert all(e.dropped for e in posts)


async def test_decision_conflict_and_cancel(sim: Any) -> None:
    # A slower clock than the default: after the approval the run must still be running when
    # the cancel arrives, however loaded the machine (at the default it ended first under load).
    sim.load_scenario(builtin_scenario("loss-spike").with_options(time_scale=50_000))
    async with _client(sim) as client:
        request = await _confirmed(client, sample_request(COMPLETED, budget_usd=1e9))
        run = (await client.submit_training_run(request, idempotency_key="k-s")).run
        with pytest.raises(exc.ActionNotPending):
            await client.decide(
                run.run_id,
                "act-nope",
                DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="a", reason="r"),
                idempotency_key="k-d0",
            )
        while run.state is not RunState.AWAITING_DECISION:
            assert not run.state.terminal
            run = await client.get_training_run(run.run_id, after_version=run.version, wait=5)
        assert run.pending_action is not None
        action = run.pending_action.action_id
        approve = DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="ana", reason="ok")
        reject = DecisionRequest(decision=DecisionChoice.REJECT, decided_by="bo", reason="no")
        await client.decide(run.run_id, action, approve, idempotency_key="k-d1")
        await client.decide(run.run_id, action, approve, idempotency_key="k-d1")
        with pytest.raises(exc.DecisionConflict):
            await client.decide(run.run_id, action, reject, idempotency_key="k-d2")
        cancelled = await client.cancel_training_run(
            run.run_id, reason="enough", idempotency_key="k-c"
        )
    assert cancelled.state is RunState.CANCELLED
