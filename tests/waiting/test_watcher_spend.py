"""``Watcher`` and flow runs that wait for a person to confirm a spend, against a real Prefect
server and the simulator: it resumes such a run once the backend's quote is no longer pending
(without an input: the flow reads the quote again itself), never while it is, never on a record
that names a backend this process is not configured for, and never on a record it cannot read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from capture_server import CaptureServer
from flow_helpers import BOOKING, REQUEST, sweep_watcher, training_deployment
from prefect import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.input import keyset_from_paused_state
from prefect.states import Running, Suspended
from spend_helpers import covering_authorization, revoke

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.refusals import Uncovered
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import ALL_SCOPES, TrainingRequest
from prefect_ito.people import spend
from prefect_ito.people.notices import PERSON_NEEDED, tell_again
from prefect_ito.simulator import builtin_scenario
from prefect_ito.waiting.keys import QUOTE_RECORD_PREFIX
from prefect_ito.waiting.waits import QuoteWait, record_wait
from prefect_ito.waiting.watcher import Watcher

QUOTE_REQUEST = TrainingRequest(
    booking_id=BOOKING,
    model_size=REQUEST["model_size"],
    data_refs=REQUEST["data"],
    target=REQUEST["target"],
    budget_usd=REQUEST["budget_usd"],
)

RESUME_WITHIN = 20.0
"""A bound on a hang, not a speed figure: seconds from a person's answer to the watcher's resume,
with the watcher sweeping every second. It resumes within a sweep or two (the test prints the
figure); a machine running three test workers on two cores took 7.5 s where 5 were asked."""


async def new_quote(api_url: str):
    """Return a new quote of the tests' request from the backend at ``api_url``, pending."""
    async with ItoCredentials(api_url=api_url).get_client() as client:
        return await client.quote_training_run(QUOTE_REQUEST.to_submission())


async def asking_flow_run(quote, *, api_url: str, keyring_entry: str | None = None):
    """Leave a flow run suspended on ``quote`` as ``wait_for_person`` does: its record first."""
    deployment = await training_deployment("watcher-spend-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": {**REQUEST, "booking": BOOKING}}
        )
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
    await ask_again(flow_run, quote, api_url=api_url, keyring_entry=keyring_entry)
    return flow_run


async def asked_of_a_quote(simulator, flow_runs: list):
    """Return a fresh quote and a flow run suspended on it, which ``flow_runs`` deletes after."""
    quote = await new_quote(simulator.url)
    flow_run = await asking_flow_run(quote, api_url=simulator.url)
    flow_runs.append(flow_run)
    return quote, flow_run


async def ask_again(
    flow_run, quote, *, api_url: str, keyring_entry: str | None = None, **why: Any
) -> None:
    record = QuoteWait(
        api_url=api_url,
        keyring_entry=keyring_entry,
        quote_id=quote.quote_id,
        manifest_digest=quote.manifest_digest,
        expires_at=quote.expires_at,
        **why,
    )
    await record_wait(flow_run.id, record)
    # A question asked again gets a key of its own (see prefect_ito.people.answers), as the flow's
    # do.
    asked = _ASKED.setdefault(flow_run.id, 0)
    _ASKED[flow_run.id] += 1
    key = spend.pause_key(quote.manifest_digest) + (f"-again-{asked}" if asked else "")
    # As ``asuspend_flow_run(wait_for_input=SpendDecision)`` leaves it: the form's keyset on
    # the state and its schema saved, so that Prefect resumes it only with an answer.
    suspended = Suspended(pause_key=key)
    keyset = keyset_from_paused_state(suspended)
    suspended.state_details.run_input_keyset = keyset
    await spend.SpendDecision.with_initial_data(description="spend").asave(
        keyset, flow_run_id=flow_run.id
    )
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, suspended, force=True)


_ASKED: dict[object, int] = {}


async def answer(simulator, quote_id: str, how: str) -> None:
    """Confirm (as a person, with a token of their own) or decline a quote at the backend."""
    token = simulator.mint_token(
        "flow-tests", scopes=[s.value for s in ALL_SCOPES], principal="user:ada"
    )
    async with ItoClient(simulator.url, token) as person:
        answering = person.confirm_quote if how == "confirm" else person.decline_quote
        await answering(quote_id, idempotency_key=f"tests-{uuid.uuid4()}")


async def is_paused(flow_run_id) -> bool:
    async with get_client() as client:
        state = (await client.read_flow_run(flow_run_id)).state
    return state is not None and state.is_paused()


async def resumed_within(flow_run_id, seconds: float) -> float:
    """Return how long the flow run stayed paused, failing after ``seconds``."""
    started = time.monotonic()
    async with asyncio.timeout(seconds):
        while await is_paused(flow_run_id):
            await asyncio.sleep(0.1)
    return time.monotonic() - started


async def sweep_and_close(watcher: Watcher, times: int) -> None:
    """Sweep ``times`` times, then close the watcher."""
    try:
        for _ in range(times):
            await watcher.sweep()
    finally:
        await watcher.close()


async def resumed_once_settled(
    flow_run_id, settle: Callable[[], Awaitable[object]]
) -> tuple[Watcher, float]:
    """Run a watcher a couple of sweeps while the question is pending (the run stays paused),
    then ``settle`` it at the backend; return the watcher, and how soon after it resumed the run."""
    watcher, stop = Watcher(wait=1.0, lost_after=None), asyncio.Event()
    running = asyncio.ensure_future(watcher.run(stop))
    try:
        await asyncio.sleep(2.5)  # a couple of sweeps: pending, so it waits on
        assert await is_paused(flow_run_id)
        await settle()
        took = await resumed_within(flow_run_id, 30)
    finally:
        stop.set()
        await running
    return watcher, took


async def resume_inputs(flow_run_id) -> list:
    """Return the answers a resume left: the watcher's ``recheck``, which decides nothing."""
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            flow_run_id, key_prefix="", limit=100, exclude_keys=set()
        )
    return [json.loads(item.value) for item in inputs if item.key.endswith("-response")]


@pytest.mark.parametrize("feed", [True, False], ids=["change-feed", "per-quote-reads"])
@pytest.mark.parametrize("how", ["confirm", "decline"])
async def test_a_run_is_resumed_within_seconds_of_its_quote_being_answered(
    start_simulator, flow_runs, feed, how
):
    simulator = start_simulator(
        builtin_scenario("default").model_copy(update={"change_feed": feed})
    )
    quote, flow_run = await asked_of_a_quote(simulator, flow_runs)
    watcher, took = await resumed_once_settled(
        flow_run.id, lambda: answer(simulator, quote.quote_id, how)
    )

    print(f"resumed {took:.2f} s after the answer")
    assert took < RESUME_WITHIN, took
    assert watcher.resumed in ([flow_run.id], [])  # forgotten once it no longer waits
    # Resumed with the one answer the form takes that decides nothing: the flow reads the quote.
    (given,) = await resume_inputs(flow_run.id)
    assert given["decision"] == "recheck" and how in given["reason"]
    paths = [r.path for r in simulator.requests()]
    assert f"/v0/training-quotes/{quote.quote_id}" in paths
    assert ("/v0/training-runs/changes" in paths) is feed


async def test_a_run_whose_quote_expired_is_resumed(start_simulator, flow_runs):
    # Expiry comes on no feed: the watcher reads the quote every sweep.
    scenario = builtin_scenario("default").model_copy(update={"quote_ttl_seconds": 2.0})
    simulator = start_simulator(scenario)
    _, flow_run = await asked_of_a_quote(simulator, flow_runs)
    watcher = Watcher(wait=1.0, lost_after=None)
    try:
        async with asyncio.timeout(30):
            while await is_paused(flow_run.id):
                await watcher.sweep()
    finally:
        await watcher.close()
    assert watcher.resumed == [flow_run.id]


async def test_a_run_whose_quote_is_pending_is_never_resumed(start_simulator, flow_runs):
    simulator = start_simulator()
    quote, flow_run = await asked_of_a_quote(simulator, flow_runs)
    watcher = Watcher(wait=0.5, lost_after=None)
    await sweep_and_close(watcher, times=4)

    assert watcher.resumed == [] and await is_paused(flow_run.id)
    reads = [r for r in simulator.requests() if r.path == f"/v0/training-quotes/{quote.quote_id}"]
    assert len(reads) >= 4  # read every sweep, and left alone every time


async def test_a_run_that_asks_again_after_a_resume_is_resumed_again(start_simulator, flow_runs):
    # The flow asks again under the same pause key (a new quote of the same manifest): the
    # watcher that resumed its first suspension must not take it for the same one.
    simulator = start_simulator()
    first, flow_run = await asked_of_a_quote(simulator, flow_runs)
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        await answer(simulator, first.quote_id, "decline")
        await watcher.sweep()
        assert watcher.resumed == [flow_run.id]
        second = await new_quote(simulator.url)
        await ask_again(flow_run, second, api_url=simulator.url)
        await watcher.sweep()
        assert await is_paused(flow_run.id)  # the new quote is pending
        await answer(simulator, second.quote_id, "confirm")
        async with asyncio.timeout(30):
            while await is_paused(flow_run.id):
                await watcher.sweep()
    finally:
        await watcher.close()
    async with get_client() as client:
        history = await client.read_flow_run_states(flow_run.id)
    assert [state.name for state in history].count("Resuming") == 2


async def test_a_record_naming_their_server_sends_it_nothing(worker_environment, flow_runs, caplog):
    simulator = worker_environment
    quote = await new_quote(simulator.url)
    await answer(simulator, quote.quote_id, "confirm")  # a real quote, answered: tempting
    with CaptureServer() as theirs:
        forged = await asking_flow_run(quote, api_url=theirs.url)
        # The keyring route: their server, with the real backend's keyring entry named.
        by_entry = await asking_flow_run(quote, api_url=theirs.url, keyring_entry=simulator.url)
        flow_runs += [forged, by_entry]
        watcher = await sweep_watcher(caplog)

    assert theirs.received == []
    refusals = [
        r.getMessage()
        for r in caplog.records
        if f"Not watching runs recorded for {theirs.url}" in r.getMessage()
    ]
    assert len(refusals) == 2, refusals  # each said once, not every sweep
    assert any("ITO_COMPUTE_ALLOWED_ORIGINS" in message for message in refusals)
    assert any("another backend" in message for message in refusals)
    assert watcher.resumed == []
    assert await is_paused(forged.id) and await is_paused(by_entry.id)


async def test_a_run_without_a_readable_record_is_left_alone_and_costs_the_sweep_nothing(
    start_simulator, flow_runs, caplog
):
    simulator = start_simulator()
    quote = await new_quote(simulator.url)
    junk = await asking_flow_run(quote, api_url=simulator.url)
    async with get_client() as client:
        for item in await client.filter_flow_run_input(
            junk.id, key_prefix=QUOTE_RECORD_PREFIX, limit=10, exclude_keys=set()
        ):
            await client.delete_flow_run_input(junk.id, item.key)
        await client.create_flow_run_input(junk.id, QUOTE_RECORD_PREFIX + "x", '{"not": 1}')
    answered = await new_quote(simulator.url)
    other = await asking_flow_run(answered, api_url=simulator.url)
    flow_runs += [junk, other]
    await answer(simulator, answered.quote_id, "confirm")
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        with caplog.at_level(logging.WARNING, logger="prefect_ito.waiting.watcher"):
            for _ in range(3):
                await watcher.sweep()
    finally:
        await watcher.close()

    said = [
        r.getMessage()
        for r in caplog.records
        if str(junk.id) in r.getMessage() and "without a record" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert not [r for r in caplog.records if "A sweep failed" in r.getMessage()]
    assert await is_paused(junk.id) and not await is_paused(other.id)


async def test_an_invalid_answer_written_into_the_pause_does_not_block_the_resume(
    start_simulator, flow_runs
):
    # Before: a colleague wrote an answer the form does not take under the pause's response key;
    # every resume then met it (409, "changed meanwhile; skipped") and the run waited for good,
    # though a person had confirmed at the backend.
    simulator = start_simulator()
    quote, flow_run = await asked_of_a_quote(simulator, flow_runs)
    async with get_client() as client:
        paused = (await client.read_flow_run(flow_run.id)).state
        response = paused.state_details.run_input_keyset["response"]
        await client.create_flow_run_input(flow_run.id, response, '{"decision": "spend-it-all"}')
    await answer(simulator, quote.quote_id, "confirm")
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        async with asyncio.timeout(30):
            while await is_paused(flow_run.id):
                await watcher.sweep()
                await asyncio.sleep(0.3)
    finally:
        await watcher.close()

    assert watcher.resumed == [flow_run.id]
    (given,) = await resume_inputs(flow_run.id)
    assert given["decision"] == "recheck"  # the watcher's, which decides nothing


async def referenced_asking_flow_run(simulator, flow_runs, **why: Any):
    """Return a flow run asking about a quote that names it (as the flow's do), and the quote."""
    deployment = await training_deployment("watcher-spend-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": {**REQUEST, "booking": BOOKING}}
        )
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
    flow_runs.append(flow_run)
    # The flow's quote names the flow run that asks (contract v0.5: a quote's client reference).
    async with ItoCredentials(api_url=simulator.url).get_client() as backend:
        submission = QUOTE_REQUEST.to_submission().referenced(str(flow_run.id))
        quote = await backend.quote_training_run(submission)
    assert quote.client_reference == str(flow_run.id)
    await ask_again(flow_run, quote, api_url=simulator.url, **why)
    return flow_run, quote


async def test_a_spend_question_whose_saying_prefect_lost_is_said_again_from_the_backend(
    start_simulator, flow_runs
):
    simulator = start_simulator("default")
    flow_run, quote = await referenced_asking_flow_run(simulator, flow_runs)
    decoy = await asking_flow_run(quote, api_url=simulator.url)  # a forged record, same quote
    flow_runs.append(decoy)

    watcher = Watcher(wait=0.5, lost_after=None, tell_again=tell_again, tell_again_after=0.0)
    told = await said_again(watcher, flow_run.id)

    assert told.payload["kind"] == "spend" and quote.quote_id in told.payload["evidence"]
    assert told.payload["command"] == f"prefect-ito confirm {quote.quote_id} [--decline]"
    assert any(r.id == f"prefect.flow-run.{flow_run.id}" for r in told.related)
    assert await needed_events(decoy.id) == []
    assert watcher.resumed == [] and await is_paused(flow_run.id)
    assert told.payload["why"] is None  # an older record does not say why: nothing is made up


async def test_a_spend_said_again_says_no_authorization_was_named_as_first_said(
    start_simulator, flow_runs
):
    # Before: the first telling said why a person was asked, the telling again did not.
    simulator = start_simulator("default")
    flow_run, _ = await referenced_asking_flow_run(simulator, flow_runs, named_authorization=False)

    watcher = Watcher(wait=0.5, lost_after=None, tell_again=tell_again, tell_again_after=0.0)
    told = await said_again(watcher, flow_run.id)

    assert told.payload["why"] == spend.NO_AUTHORIZATION


async def test_a_spend_said_again_after_a_revoke_says_which_authorization_and_why(
    start_simulator, flow_runs
):
    # Before: a nightly run asked because its authorization was revoked was told again with no
    # word of why a person was suddenly needed.
    simulator = start_simulator("default")
    revoked = covering_authorization(simulator)
    revoke(simulator, revoked.authorization_id)
    refused = Uncovered(
        authorization_id=revoked.authorization_id, reason="the authorization is revoked"
    )

    told = await said_again_when_refused(simulator, flow_runs, refused)

    # Named as the backend names it, in the state the backend says it is in now.
    assert told.payload["why"] == (
        f"the standing authorization prefect-ito's own tests ({revoked.authorization_id}) does "
        "not cover this run: the authorization is revoked"
    )


async def test_the_reason_a_record_gives_for_an_active_authorization_is_said_again_quoted(
    start_simulator, flow_runs
):
    # The backend keeps no reason for a refusal; the record's is anyone's words: quoted as such.
    simulator = start_simulator("default")
    active = covering_authorization(simulator)
    refused = Uncovered(
        authorization_id=active.authorization_id,
        reason='the budget is above the limit\nsee "https://evil.example"',
    )

    told = await said_again_when_refused(simulator, flow_runs, refused)

    assert told.payload["why"] == (
        f"the standing authorization prefect-ito's own tests ({active.authorization_id}) does "
        "not cover this run: the backend's reason, as the flow run recorded it: \"the budget is "
        "above the limit see 'https://evil.example'\""
    )


async def said_again_when_refused(simulator, flow_runs, refused: Uncovered):
    """Ask about a quote as a flow run that named a standing authorization ``refused`` says
    did not cover it; return the ``person.needed`` a watcher then says again."""
    flow_run, _ = await referenced_asking_flow_run(
        simulator, flow_runs, named_authorization=True, refused=refused
    )
    watcher = Watcher(wait=0.5, lost_after=None, tell_again=tell_again, tell_again_after=0.0)
    return await said_again(watcher, flow_run.id)


async def said_again(watcher: Watcher, flow_run_id, sweeps: int = 3):
    """Sweep ``sweeps`` times, and return the one ``person.needed`` Prefect then holds of the
    flow run (a second one would be in by the end: events arrive in batches)."""
    try:
        await watcher.sweep()
        async with asyncio.timeout(30):
            while not await needed_events(flow_run_id):
                await asyncio.sleep(0.5)
        for _ in range(sweeps - 1):
            await watcher.sweep()
        await asyncio.sleep(2)
        (told,) = await needed_events(flow_run_id)
    finally:
        await watcher.close()
    return told


async def needed_events(flow_run_id) -> list:
    async with get_client() as client:
        page = await client.read_events(
            filter=EventFilter(
                event=EventNameFilter(name=[PERSON_NEEDED]),
                resource=EventResourceFilter(id_prefix=[f"ito.question.{flow_run_id}."]),
            ),
            limit=50,
        )
    return page.events
