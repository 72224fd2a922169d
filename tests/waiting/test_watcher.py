"""``Watcher`` against a real Prefect server and the simulator: it resumes a deferred flow run
when its backend run changes — on the change feed, or on per-run long-polls without one — and
never one that waits for a person."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from flow_helpers import BOOKING, REQUEST, training_deployment
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled, Cancelling, Crashed, Pending, Running, Suspended
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import BookingStatus
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.people import spend
from prefect_ito.simulator import SimBooking, builtin_scenario
from prefect_ito.simulator.builtins import SECOND_COMPLETED_BOOKING
from prefect_ito.waiting import deferral
from prefect_ito.waiting.deferral import Deferral, deferral_key
from prefect_ito.waiting.watcher import Watcher


async def deferred_flow_run(
    simulator, *, key: str | None = None, booking: str = BOOKING, deployment=None
):
    """Submit a backend run and leave a flow run suspended on it, as a deferring flow does.

    Every flow run it makes on one simulator and booking waits on the same run: the one their
    shared key made. ``deployment``: the flow run's (deployed here when not given).
    """
    training = TrainingParameters(
        **{**REQUEST, "booking": booking, "idempotency_key": f"watched-{booking}"}
    )
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator),
    )
    run = (await job.trigger()).run
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        while run.current_stage is None:
            await asyncio.sleep(0.05)  # many at once: leave the simulator's thread time to answer
            run = await client.get_training_run(run.run_id)
    deployment = deployment or await training_deployment("watcher-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": training.model_dump(mode="json")}
        )
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        pause_key = key or deferral_key(run)
        record = Deferral(
            api_url=simulator.url, run_id=run.run_id, version=run.version, stage=run.current_stage,
            events_seen=0, heartbeat_at=run.heartbeat_at, heartbeat_seen_at=time.time(),
            stall_timeout=None, deadline_at=None,
        )  # fmt: skip
        await client.create_flow_run_input(flow_run.id, pause_key, record.model_dump_json())
        await client.set_flow_run_state(flow_run.id, Suspended(pause_key=pause_key), force=True)
    return flow_run, run


async def is_paused(flow_run_id) -> bool:
    async with get_client() as client:
        state = (await client.read_flow_run(flow_run_id)).state
    return state is not None and state.is_paused()


async def sweep_past_the_end(watcher: Watcher, simulator, flow_run, run) -> None:
    """Sweep once (nothing to handle yet), end the backend run, sweep until the run is resumed."""
    try:
        await watcher.sweep()
        assert await is_paused(flow_run.id)  # nothing it must handle yet: it waits on
        async with ItoCredentials(api_url=simulator.url).get_client() as client:
            await client.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
        async with asyncio.timeout(60):
            while await is_paused(flow_run.id):
                await watcher.sweep()
    finally:
        await watcher.close()


@pytest.mark.parametrize("feed", [True, False], ids=["change-feed", "per-run-long-polls"])
async def test_a_deferred_run_is_resumed_when_its_backend_run_ends(start_simulator, feed):
    scenario = builtin_scenario("default").with_options(time_scale=1.0)  # stages last hours
    simulator = start_simulator(scenario.model_copy(update={"change_feed": feed}))
    flow_run, run = await deferred_flow_run(simulator)
    watcher = Watcher(wait=1.0, lost_after=None)
    await sweep_past_the_end(watcher, simulator, flow_run, run)

    assert watcher.resumed == [flow_run.id]
    paths = [r.path for r in simulator.requests()]
    assert ("/v0/training-runs/changes" in paths) is feed


@pytest.mark.parametrize(
    "key", ["restart-act-1", spend.pause_key("sha256:" + "0" * 64)], ids=["restart", "spend"]
)
async def test_a_run_waiting_for_a_person_is_never_resumed(start_simulator, key):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, run = await deferred_flow_run(simulator, key=key)
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        await client.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        for _ in range(3):
            await watcher.sweep()
    finally:
        await watcher.close()

    assert watcher.resumed == [] and await is_paused(flow_run.id)


async def test_a_heartbeat_in_the_window_means_alive_and_none_means_lost(prefect_server):
    # Prefect answers at most 50 events a page: asking for more failed every sweep, and with
    # it the watcher's whole loop, so no lost machine was ever noticed.
    from uuid import uuid4

    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    from prefect_ito.waiting.recovery import heartbeating

    beating, silent = uuid4(), uuid4()
    window = datetime.now(UTC) - timedelta(seconds=5)
    emit_event(
        event="prefect.flow-run.heartbeat",
        resource={"prefect.resource.id": f"prefect.flow-run.{beating}"},
    )
    await asyncio.to_thread(EventsWorker.drain_all)
    async with asyncio.timeout(60):
        while not await heartbeating({beating}, window):
            await asyncio.sleep(0.5)  # events are stored a moment after they arrive

    assert set(await heartbeating({beating, silent}, window)) == {beating}
    assert await heartbeating({beating}, datetime.now(UTC)) == {}


async def test_an_unreachable_prefect_is_one_warning_a_sweep_not_a_traceback(caplog):
    import logging

    from prefect.settings import PREFECT_API_URL, temporary_settings

    stop = asyncio.Event()
    watcher = Watcher(wait=0.2, lost_after=None)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        caplog.set_level(logging.WARNING, logger="prefect_ito.waiting.watcher")
        task = asyncio.ensure_future(watcher.run(stop))
        async with asyncio.timeout(60):
            while not caplog.records:
                await asyncio.sleep(0.1)
        stop.set()
        await task

    assert "A sweep failed" in caplog.records[0].getMessage()
    assert all(record.exc_info is None for record in caplog.records)


async def test_a_prefect_server_of_another_major_version_is_one_warning_a_sweep(caplog):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with _prefect_server_answering_version("2.20.16") as api_url:
        stop = asyncio.Event()
        watcher = Watcher(wait=0.2, lost_after=None)
        with temporary_settings({PREFECT_API_URL: api_url}):
            caplog.set_level(logging.WARNING, logger="prefect_ito.waiting.watcher")
            task = asyncio.ensure_future(watcher.run(stop))
            async with asyncio.timeout(60):
                while len(caplog.records) < 2:
                    await asyncio.sleep(0.1)
            stop.set()
            await task

    assert all("A sweep failed" in record.getMessage() for record in caplog.records)
    assert "server: 2.20.16" in caplog.records[0].getMessage()
    assert all(record.exc_info is None for record in caplog.records)


@contextlib.contextmanager
def _prefect_server_answering_version(version: str) -> Iterator[str]:
    """Serve what a Prefect server of ``version`` says of itself; yield its API URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(version if self.path == "/api/admin/version" else True).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_a_watcher_makes_one_prefect_client_a_sweep_and_one_a_listing(
    start_simulator, monkeypatch
):
    await deferred_flow_run(start_simulator(builtin_scenario("default")))
    made, sweeps, listings = [], [], []
    original_init, original_sweep, original_list = (
        PrefectClient.__init__,
        Watcher.sweep,
        Watcher._list,
    )

    def counted_init(self, *args, **kwargs):
        made.append(self)
        original_init(self, *args, **kwargs)

    async def counted_sweep(self):
        sweeps.append(time.monotonic())
        await original_sweep(self)

    async def counted_list(self):
        listings.append(time.monotonic())
        return await original_list(self)

    monkeypatch.setattr(PrefectClient, "__init__", counted_init)
    monkeypatch.setattr(Watcher, "sweep", counted_sweep)
    monkeypatch.setattr(Watcher, "_list", counted_list)
    stop = asyncio.Event()
    # Looks for lost runs (one client each, every 10 s) left out: this counts sweeps' clients.
    watcher = Watcher(wait=0.5, lost_after=None, look_for_lost_every=3600)
    task = asyncio.ensure_future(watcher.run(stop))
    async with asyncio.timeout(60):
        while len(sweeps) < 3:
            await asyncio.sleep(0.1)
    stop.set()
    await task

    # A sweep that follows a deferred run asked for a client in each step (listing, recovery,
    # the deferral's record), and each new one loads the CA bundle into a TLS context. A listing
    # runs beside the sweeps (it may outlive the one that started it), with a client of its own.
    assert len(made) <= len(sweeps) + len(listings), (
        f"{len(made)} Prefect clients for {len(sweeps)} sweeps and {len(listings)} listings"
    )


async def flow_run_through(start_simulator, *states) -> FlowRun:
    """Return a deferred training flow run, read back after it went through ``states``."""
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    async with get_client() as client:
        for state in states:
            await client.set_flow_run_state(flow_run.id, state, force=True)
        return await client.read_flow_run(flow_run.id)


async def test_a_loss_found_by_two_watchers_is_re_entered_once(start_simulator):
    # Two watchers (or one whose list of lost runs is a moment old) find the same crash: the
    # second used to reschedule again, under the run its first re-entry had started.
    lost = await flow_run_through(start_simulator, Crashed())  # what both watchers saw
    first, second = Watcher(lost_after=None), Watcher(lost_after=None)

    await first.recovery.reenter(lost)
    async with get_client() as client:
        await client.set_flow_run_state(lost.id, Running(), force=True)  # a worker ran it
    await second.recovery.reenter(lost)

    async with get_client() as client:
        now = await client.read_flow_run(lost.id)
        claims = await client.filter_flow_run_input(
            lost.id, key_prefix="ito-recovery-", limit=10, exclude_keys=set()
        )
    assert (first.recovered, second.recovered) == ([lost.id], [])
    assert now.state_name == "Running" and len(claims) == 1


async def test_a_cancel_prefect_recorded_as_a_crash_is_finished_as_a_cancel(start_simulator):
    # Prefect 3.9.1 records a cancel as a crash when its SIGTERM lands inside an AnyIO task
    # group (the engine meets a BaseExceptionGroup, not the cancellation); the worker then runs
    # the cancellation hooks but leaves the run Crashed. Re-entering it undid a person's cancel.
    flow_run = await flow_run_through(start_simulator, Running(), Cancelling(), Crashed())
    watcher = Watcher(lost_after=None)

    await watcher.recovery.reenter(flow_run)
    await watcher.recovery.reenter(flow_run)  # a second look at the same crash changes nothing

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
        names = [state.name for state in await client.read_flow_run_states(flow_run.id)]
    assert watcher.recovered == []
    assert now.state_name == "Cancelled" and names.count("Cancelled") == 1, names


async def test_a_run_cancelled_before_it_last_started_is_still_re_entered(start_simulator):
    # Only a cancel since the run last started tells a crash from a loss: a run re-entered
    # after an earlier cancel request (which its process outlived) is lost like any other.
    states = (Running(), Cancelling(), Running(), Crashed())
    flow_run = await flow_run_through(start_simulator, *states)
    watcher = Watcher(lost_after=None)

    await watcher.recovery.reenter(flow_run)

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert watcher.recovered == [flow_run.id] and now.state_name == "Recovering"


async def test_a_run_left_starting_by_a_lost_worker_is_re_entered(start_simulator):
    # A worker killed while it started a flow run leaves it Pending: it never beats, and nobody
    # reports a crash. Found by the crash trials: such runs waited forever.
    flow_run = await flow_run_through(start_simulator, Pending())
    watcher = Watcher(lost_after=1)
    await asyncio.sleep(3)  # longer than a start may take (twice lost_after): no heartbeat came

    await watcher.recovery.recover()

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert flow_run.id in watcher.recovered and now.state_name == "Recovering"


async def _suspend_for_a_person(flow_run_id, key: str, *, form_saved: bool, keyset=None):
    """Suspend the flow run for a restart decision, as Prefect accepts it; save the form or not."""
    from prefect.input.run_input import keyset_from_paused_state

    from prefect_ito.people.approval import RestartCheck

    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Running(), force=True)
        state = Suspended(pause_key=key, timeout_seconds=3_600)
        keyset = keyset or keyset_from_paused_state(state)
        state.state_details.run_input_keyset = keyset
        await client.set_flow_run_state(flow_run_id, state, force=True)
    if form_saved:  # what the flow process does next, once the suspension was accepted
        await RestartCheck.asave(keyset, flow_run_id=flow_run_id)


async def test_a_run_suspended_for_a_person_whose_form_never_came_is_re_entered(
    start_simulator, caplog
):
    # Found by the crash trials: the machine was lost after Prefect accepted a run's suspension
    # for a restart decision and before its process saved the form, which a flow can only save
    # after (the server deletes a pause's inputs as it begins). Prefect then refused every
    # answer, the UI's too ("Run input schema not found"), and the run waited for good.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    lost, _ = await deferred_flow_run(simulator)
    asking, _ = await deferred_flow_run(simulator)
    await _suspend_for_a_person(lost.id, "restart-act-lost", form_saved=False)
    await _suspend_for_a_person(asking.id, "restart-act-asking", form_saved=True)
    answer = {"decision": "approve", "decided_by": "Ada", "reason": "a bad data shard"}
    async with get_client() as client:
        refused = await client.resume_flow_run(lost.id, run_input=answer)
    assert refused.status.value == "REJECT"  # nobody can answer it
    watcher = Watcher(lost_after=1)
    await asyncio.sleep(2)  # longer than lost_after: no heartbeat came

    with caplog.at_level(logging.INFO, logger="prefect_ito.waiting.watcher"):
        await watcher.recovery.recover()
        await watcher.recovery.recover()  # a later sweep finds each the same

    async with get_client() as client:
        now = {run.id: await client.read_flow_run(run.id) for run in (lost, asking)}
    assert watcher.recovered == [lost.id]
    assert now[lost.id].state_name == "Recovering"  # runs again from the top, and asks again
    assert now[asking.id].state_name == "Suspended"  # its form is there: a person may answer
    said = [record.getMessage() for record in caplog.records if "Re-entered" in record.getMessage()]
    assert said == [
        f"Re-entered lost flow run {lost.id} (it was Suspended, with no form Prefect could take "
        "an answer on; it asks again)."
    ]


async def test_a_suspension_a_prefect_user_wrote_without_a_form_key_fails_no_sweep(
    start_simulator,
):
    # Anyone with Prefect API access can write a state: a keyset naming no form once failed
    # every sweep (a KeyError), and with it every other run's recovery.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    written, _ = await deferred_flow_run(simulator)
    lost, _ = await deferred_flow_run(simulator)
    hostile = {"response": "suspended-restart-act-written-response"}
    await _suspend_for_a_person(written.id, "restart-act-written", form_saved=False, keyset=hostile)
    await _suspend_for_a_person(lost.id, "restart-act-lost", form_saved=False)
    watcher = Watcher(lost_after=1)
    await asyncio.sleep(2)  # longer than lost_after: no heartbeat came

    await watcher.recovery.recover()

    async with get_client() as client:
        left = await client.read_flow_run(written.id)
    # Runs other tests left lost on the session's server are re-entered too: only these two count.
    assert [r for r in watcher.recovered if r in {written.id, lost.id}] == [lost.id]
    assert left.state_name == "Suspended"  # no question Prefect could resume: not ours to judge


async def _started_by(flow_run_id, worker: str) -> None:
    """Leave the flow run Pending as ``worker`` of the tests' pool leaves a run it starts."""
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Pending(), force=True)
        # What a worker does when it starts a run: it gives the run its name and pool.
        await client.update_flow_run_labels(
            flow_run_id,
            {
                "prefect.worker.name": worker,
                "prefect.worker.type": "process",
                "prefect.work-pool.name": "watcher-tests",
            },
        )


def _age(state) -> float:
    return (datetime.now(UTC) - state.timestamp).total_seconds()


async def _beat(worker: str) -> None:
    async with get_client() as client:
        await client.send_worker_heartbeat("watcher-tests", worker, heartbeat_interval_seconds=1)


async def test_a_run_left_starting_by_a_silent_worker_is_re_entered_after_lost_after(
    start_simulator,
):
    # The crash trials' slowest recovery: a machine lost while a run was starting. The run was
    # re-entered only after twice lost_after, although its worker was silent all along.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    await _beat("lost-worker")
    await _started_by(flow_run.id, "lost-worker")
    watcher = Watcher(lost_after=3)
    await asyncio.sleep(4)  # lost_after, not twice: neither the run nor its worker beat since

    await watcher.recovery.recover()

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert flow_run.id in watcher.recovered and now.state_name == "Recovering"


async def test_a_run_left_starting_by_a_worker_started_again_since_is_re_entered(
    start_simulator,
):
    # Found by the crash trials: a lost machine's worker came back under the same name (as a
    # systemd unit or a fixed --name does), so the name alone looked alive, and the runs the old
    # worker was starting waited twice lost_after.
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    from prefect_ito.waiting.recovery import worker_started_since

    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    await _started_by(flow_run.id, "reborn-worker")
    async with get_client() as client:
        starting = (await client.read_flow_run(flow_run.id)).state
    emit_event(  # what a worker says when it starts
        event="prefect.worker.started",
        resource={
            "prefect.resource.id": "prefect.worker.process.reborn-worker",
            "prefect.resource.name": "reborn-worker",
        },
    )
    await asyncio.to_thread(EventsWorker.drain_all)
    watcher = Watcher(lost_after=5)
    async with asyncio.timeout(60):
        while not await worker_started_since("process", "reborn-worker", starting.timestamp):
            await asyncio.sleep(0.5)  # events are stored a moment after they arrive
    await asyncio.sleep(max(0.0, 5.5 - _age(starting)))  # silent for lost_after
    await _beat("reborn-worker")  # alive, under the same name

    assert _age(starting) < 10  # not twice lost_after: only the restart can tell it is lost
    await watcher.recovery.recover()

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert flow_run.id in watcher.recovered and now.state_name == "Recovering"


async def test_a_run_starting_on_a_live_worker_gets_twice_lost_after(start_simulator):
    # A live worker reports a start that failed; a slow one (a busy machine, an image pull) is
    # not taken for a loss before twice lost_after.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    await _started_by(flow_run.id, "live-worker")
    # Past lost_after, with lost_after to spare before twice it: a busy machine once took more
    # than 2 s from the start to the sweep's reading, and the run was (rightly) re-entered.
    watcher = Watcher(lost_after=10)
    await asyncio.sleep(11)
    await _beat("live-worker")

    await watcher.recovery.recover()

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert flow_run.id not in watcher.recovered and now.state_name == "Pending"


async def test_a_run_seen_lost_that_moved_on_since_is_left_alone(start_simulator):
    # A sweep on a busy server is slow: a run seen starting (and silent) a minute ago may run by
    # the time the watcher acts. Found by the crash trials: such a live run was rescheduled, and
    # its flow process failed ("Flow run cannot be suspended").
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Pending(), force=True)
        seen = await client.read_flow_run(flow_run.id)
        await client.set_flow_run_state(flow_run.id, Running(), force=True)  # it started since
    watcher = Watcher(lost_after=1)

    await watcher.recovery.reenter(seen)

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert watcher.recovered == [] and now.state_name == "Running"


async def test_a_change_seen_by_several_watchers_resumes_the_run_once(start_simulator):
    # Watchers that follow the same feed see the same change at the same moment. Prefect checks
    # that a run is paused before it resumes it, but not in the write itself: two resumes that
    # raced both went through, and the run's history held two Resuming states for one suspension
    # (seen in the crash trials on PostgreSQL).
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, run = await deferred_flow_run(simulator)
    async with get_client() as client:
        seen = await client.read_flow_run(flow_run.id)  # what every watcher saw
    key = seen.state.state_details.pause_key
    record = await deferral.read_deferral(flow_run.id, key)
    watchers = [Watcher(lost_after=None) for _ in range(4)]

    await asyncio.gather(*(watcher._resume(seen, record, run) for watcher in watchers))

    async with get_client() as client:
        history = await client.read_flow_run_states(flow_run.id)
    assert [state.name for state in history].count("Resuming") == 1
    assert sum(len(watcher.resumed) for watcher in watchers) == 1


async def test_two_watchers_over_many_deferred_runs_resume_each_once(start_simulator):
    # Two watchers follow the same feed and see every change at once; between listings each
    # acts from what it last listed. Each suspension is resumed by one of them, never by both.
    many = 8  # enough that both watchers hold many at once; setting each up is the cost
    bookings = [SimBooking(booking_id=f"bk-many-{i:02d}", status=BookingStatus.COMPLETED)
                for i in range(many)]  # fmt: skip
    scenario = builtin_scenario("default").with_options(time_scale=1.0)  # stages last hours
    simulator = start_simulator(scenario.model_copy(update={"bookings": bookings}))
    deployment = await training_deployment("watcher-tests")
    limit = asyncio.Semaphore(8)

    async def defer(booking: str):
        async with limit:
            return await deferred_flow_run(simulator, booking=booking, deployment=deployment)

    deferred = await asyncio.gather(*(defer(b.booking_id) for b in bookings))
    stop, watchers = asyncio.Event(), [Watcher(wait=1.0, lost_after=None) for _ in range(2)]
    running = [asyncio.ensure_future(watcher.run(stop)) for watcher in watchers]
    try:
        async with asyncio.timeout(60):  # both have listed and read every run
            while not all(run.run_id in w._seen for w in watchers for _, run in deferred):
                await asyncio.sleep(0.1)
        assert all([await is_paused(flow_run.id) for flow_run, _ in deferred])  # nothing to resume
        async with ItoCredentials(api_url=simulator.url).get_client() as client:
            await asyncio.gather(*(
                client.cancel_training_run(run.run_id, reason="test", idempotency_key=run.run_id)
                for _, run in deferred
            ))  # fmt: skip
        async with asyncio.timeout(120):
            for flow_run, _ in deferred:
                while await is_paused(flow_run.id):
                    await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*running)

    async with get_client() as client:
        histories = [await client.read_flow_run_states(flow_run.id) for flow_run, _ in deferred]
    assert [[s.name for s in history].count("Resuming") for history in histories] == [1] * many


STALE = 15.0


async def test_a_resume_claimed_by_a_watcher_that_died_is_taken_over_once_stale(
    start_simulator, monkeypatch
):
    # Found by the crash trials: a watcher killed between claiming a resume and resuming left
    # the run deferred for good. The other watcher saw the claim while it was fresh, and its
    # backend run never changed again, so nobody looked at the run again.
    from prefect_ito.waiting import claims

    # Long enough that a busy machine's first sweep still finds the claim fresh (3 s was not).
    monkeypatch.setattr(claims, "CLAIM_STALE_SECONDS", STALE)
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, run = await deferred_flow_run(simulator)
    async with get_client() as client:
        seen = await client.read_flow_run(flow_run.id)
        prefix = f"ito-resume-{seen.state.id}-"
        assert await claims.claim_turn(client, flow_run.id, prefix, [], "")  # then it died
    claimed_at = time.monotonic()
    async with ItoCredentials(api_url=simulator.url).get_client() as backend:
        await backend.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
    # The watcher first sees the claim a while after it was stored (found as a CI failure on a
    # busy machine): it must look again when the claim goes stale, not that long after seeing it.
    await asyncio.sleep(3.0)
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        await watcher.sweep()  # the claim is fresh: another watcher may be resuming it
        assert watcher.resumed == [] and await is_paused(flow_run.id)
        # Until the claim is stale: by the watcher's clocks, not waited out.
        _clocks_ahead(monkeypatch, claimed_at + STALE + 0.5 - time.monotonic())
        await watcher.sweep()  # the claim is stale now: its holder never resumed
    finally:
        await watcher.close()

    assert watcher.resumed == [flow_run.id] and not await is_paused(flow_run.id)


def _clocks_ahead(monkeypatch, seconds: float) -> None:
    """Move the wall clocks a watcher judges claims and due times by ``seconds`` ahead."""
    from prefect_ito.waiting import claims

    class Ahead(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(seconds=seconds)

    monkeypatch.setattr(claims, "datetime", Ahead)
    monkeypatch.setattr(deferral, "wall_clock", lambda: Ahead.now(UTC).timestamp())


async def test_a_run_cancelled_between_the_read_and_the_resume_costs_only_itself(
    start_simulator, monkeypatch
):
    # Seen after `prefect-ito cancel` on a deferred run: Prefect's NotPausedError (neither a
    # RuntimeError nor ObjectNotFound) failed the whole sweep, and every other run waited on.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, run = await deferred_flow_run(simulator)
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        await client.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
    judge, judged = Watcher._judge, []

    async def cancelled_meanwhile(self, flow_run, record, run):
        judged.append(flow_run.id)  # a person cancels it after the sweep read it
        async with get_client() as prefect:
            await prefect.set_flow_run_state(flow_run.id, Cancelled(), force=True)
        await judge(self, flow_run, record, run)

    monkeypatch.setattr(Watcher, "_judge", cancelled_meanwhile)
    watcher = Watcher(wait=1.0, lost_after=None)
    try:
        await watcher.sweep()  # raised NotPausedError before
    finally:
        await watcher.close()
    assert judged == [flow_run.id] and watcher.resumed == []
    async with get_client() as client:
        assert (await client.read_flow_run(flow_run.id)).state.is_cancelled()


async def test_a_sweep_lists_prefect_s_flow_runs_once(start_simulator, monkeypatch):
    # Every sweep of every watcher lists runs on the team's Prefect server (each second when
    # idle, at `--wait 1`): the crashed, running, suspended and starting ones come in one listing.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, _ = await deferred_flow_run(simulator)
    listings = []
    list_flow_runs = PrefectClient.read_flow_runs

    async def counted(self, **kwargs):
        listings.append(kwargs["flow_run_filter"].state.type.any_)
        return await list_flow_runs(self, **kwargs)

    monkeypatch.setattr(PrefectClient, "read_flow_runs", counted)
    watcher = Watcher(wait=1.0)  # recovery on its defaults: it judges all four states
    try:
        await watcher.sweep()
    finally:
        await watcher.close()

    assert len(listings) == 1, listings
    assert set(listings[0]) >= {"CRASHED", "RUNNING", "PAUSED", "PENDING"}
    # It judged this one (others the session left may be re-entered): nothing to do yet.
    assert await is_paused(flow_run.id)
    assert flow_run.id not in [*watcher.resumed, *watcher.recovered]


def count_listings(monkeypatch) -> list[object]:
    """Count the listings of flow runs every watcher of this test asks Prefect for."""
    listings: list[object] = []
    list_flow_runs = PrefectClient.read_flow_runs

    async def counted(self, **kwargs):
        listings.append(kwargs["flow_run_filter"].state.type.any_)
        return await list_flow_runs(self, **kwargs)

    monkeypatch.setattr(PrefectClient, "read_flow_runs", counted)
    return listings


async def test_a_change_resumes_a_run_without_listing_prefect_s_flow_runs_again(
    start_simulator, monkeypatch
):
    # Before, every sweep listed every watched flow run, every page of them: at 500 deferred
    # runs a change waited seconds for the listing before its run was resumed.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    flow_run, run = await deferred_flow_run(simulator)
    listings = count_listings(monkeypatch)
    watcher = Watcher(wait=1.0, lost_after=None, list_every=3600)
    sweeps = 0
    try:
        await watcher.sweep()
        async with ItoCredentials(api_url=simulator.url).get_client() as client:
            await client.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
        async with asyncio.timeout(60):
            while flow_run.id not in watcher.resumed:
                await watcher.sweep()
                sweeps += 1
    finally:
        await watcher.close()

    assert sweeps >= 1 and len(listings) == 1, listings
    assert not await is_paused(flow_run.id)


async def test_a_change_naming_a_run_no_listing_showed_lists_once_more(
    start_simulator, monkeypatch
):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=1.0))
    await deferred_flow_run(simulator)
    listings = count_listings(monkeypatch)
    watcher = Watcher(wait=1.0, lost_after=None, list_every=3600)
    try:
        await watcher.sweep()
        # Deferred since the listing: the feed names its run (submitted, then in its first stage).
        later, run = await deferred_flow_run(simulator, booking=SECOND_COMPLETED_BOOKING)
        async with asyncio.timeout(60):
            while run.run_id not in {r.run_id for r in watcher._records.values()}:
                await watcher.sweep()
        listed = len(listings)
        async with ItoCredentials(api_url=simulator.url).get_client() as client:
            await client.cancel_training_run(run.run_id, reason="test", idempotency_key="c")
        async with asyncio.timeout(60):
            while later.id not in watcher.resumed:
                await watcher.sweep()
    finally:
        await watcher.close()

    assert 2 <= listed <= 3, listings  # the first, and one the unknown run asked for (or two,
    # if the flow run was still writing its record as it was listed)
    assert len(listings) == listed  # the change of a run it knows asked for none
    assert not await is_paused(later.id)


async def test_recovery_with_nothing_to_judge_opens_no_prefect_client(monkeypatch):
    # An idle watcher sweeps every few seconds (each second at `--wait 1`), and each Prefect
    # client it opens sets up TLS: tens of milliseconds of CPU apiece, for nothing to ask.
    opened = []
    open_client = PrefectClient.__aenter__

    async def counted(self):
        opened.append(self)
        return await open_client(self)

    monkeypatch.setattr(PrefectClient, "__aenter__", counted)
    watcher = Watcher(wait=1.0)  # recovery on its defaults: it judges all four states
    try:
        await watcher.recovery.recover([])
    finally:
        await watcher.close()

    assert opened == []


async def test_a_run_re_entered_in_an_earlier_sweep_is_still_resumed_when_it_defers(
    start_simulator,
):
    # A lost run the watcher re-entered runs again and may defer again: later sweeps resume it
    # like any other (only a run re-entered in the same sweep is left out of that sweep's waits).
    scenario = builtin_scenario("default").with_options(time_scale=1.0)  # stages last hours
    simulator = start_simulator(scenario)
    flow_run, run = await deferred_flow_run(simulator)
    watcher = Watcher(wait=1.0, lost_after=None)
    watcher.recovery.recovered.append(flow_run.id)  # as an earlier sweep's re-entry leaves it
    await sweep_past_the_end(watcher, simulator, flow_run, run)

    assert watcher.resumed == [flow_run.id]
