"""Chaining training after a booking: the announcing event, and training as a subflow."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from flow_helpers import BOOKING, REQUEST
from prefect import flow, get_client
from prefect.context import FlowRunContext
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.contract import RunState
from prefect_ito.flows import ito_training
from prefect_ito.reporting.chaining import (
    BOOKING_COMPLETED,
    booking_resource,
    emit_booking_completed,
)
from prefect_ito.reporting.report import TrainingSummary


def booking(booking_id: str = BOOKING) -> ItoBooking:
    return ItoBooking(
        booking_id=booking_id, gpu_sku="H200", node_count=2, gpus_per_node=8,
        fabric="InfiniBand", region="eu-north-1",
    )  # fmt: skip


async def events_about(resource_id: str, expected: int) -> list[Any]:
    """Read the stored events of a resource once ``expected`` of them arrived."""
    only = EventFilter(
        event=EventNameFilter(name=[BOOKING_COMPLETED]),
        resource=EventResourceFilter(id=[resource_id]),
    )
    async with asyncio.timeout(60), get_client() as client:
        while len(page := (await client.read_events(filter=only, limit=50)).events) < expected:
            await asyncio.sleep(0.3)
    return page


async def test_a_booking_flow_announces_the_booking(prefect_server):
    booked = booking(f"bk-chain-{uuid.uuid4().hex[:8]}")

    @flow
    async def book() -> Any:
        emit_booking_completed(booked)
        return FlowRunContext.get().flow_run.id  # type: ignore[union-attr]

    flow_run_id = await book()
    resource = booking_resource(booked.booking_id)
    (event,) = await events_about(resource["prefect.resource.id"], expected=1)

    assert dict(event.resource) == resource
    assert event.payload == {
        "gpu_sku": "H200", "node_count": 2, "gpus_per_node": 8,
        "fabric": "InfiniBand", "region": "eu-north-1",
    }  # fmt: skip
    related = {r.id for r in event.related}
    assert f"prefect.flow-run.{flow_run_id}" in related


async def test_training_runs_as_a_subflow_of_a_booking_flow(start_simulator):
    simulator = start_simulator("default")

    @flow
    async def book_then_train() -> TrainingSummary:
        booked = booking()  # what an ito-compute booking flow would return
        credentials = ItoCredentials(api_url=simulator.url)
        return await ito_training(
            {**REQUEST, "booking": booked},
            credentials=credentials,
            authorization=covering_authorization(simulator),
        )

    summary = await book_then_train()

    assert isinstance(summary, TrainingSummary)
    (run,) = simulator.runs()
    assert run.run.state is RunState.SUCCEEDED and summary.run_id == run.run_id
