"""Chaining training after an ito-compute booking: the event a booking flow emits.

prefect-ito never books. An ito-compute booking flow books GPUs and hands the completed booking
over, in one of three ways (``docs/deployments.md`` shows each):

1. **As a subflow**: the booking flow calls ``await ito_training(booking=booking, ...)``. Simple,
   but a subflow can only pause in its process while a person decides a restart; it cannot
   suspend, so the booking flow's infrastructure stays up meanwhile.
2. **Through a deployment**: ``await run_deployment("ito-training/<name>", parameters=...)``.
   The training flow run is top-level, so it suspends and holds no infrastructure while waiting.
3. **Through an event**: the booking flow calls :func:`emit_booking_completed`, and a deployment
   trigger on :data:`BOOKING_COMPLETED` starts training with the booking id from the event.

In every case the training flow verifies the booking with the backend before it submits
anything: an event or a parameter says what someone booked, not that it may train.
"""

from __future__ import annotations

from prefect.events import Event, emit_event

from prefect_ito.blocks import ItoBooking

__all__ = [
    "BOOKING_COMPLETED",
    "BOOKING_ID_LABEL",
    "booking_resource",
    "emit_booking_completed",
]

BOOKING_COMPLETED = "ito.compute.booking.completed"
"""The event name a completed booking is announced with."""

BOOKING_ID_LABEL = "ito.booking.id"
"""The resource label that carries the booking id (what a trigger passes to the flow)."""


def booking_resource(booking_id: str) -> dict[str, str]:
    """Return the Prefect resource that stands for a booking in events.

    Args:
        booking_id: The booking's id at the Itô desk.

    Returns:
        ``{"prefect.resource.id": "ito.booking.<id>", "ito.booking.id": "<id>"}``.
    """
    return {"prefect.resource.id": f"ito.booking.{booking_id}", BOOKING_ID_LABEL: booking_id}


def emit_booking_completed(booking: ItoBooking) -> Event | None:
    """Announce a completed booking, so that a deployment trigger can start training on it.

    Call it once per booking, at the end of the booking flow: each call is a new event, and each
    event starts a training flow run. (A second run with the same request re-attaches to the
    first one's backend run while it is unfinished, so nothing is trained twice meanwhile.)
    Inside a flow run Prefect relates the event to that flow run, so the chain shows in the UI.

    Args:
        booking: The completed booking, as the booking flow hands it over.

    Returns:
        The event sent, or ``None`` when Prefect has nowhere to send events.

    Example:
        At the end of an ito-compute booking flow:
        ```python
        from prefect_ito.reporting.chaining import emit_booking_completed

        emit_booking_completed(booking)  # an ItoBooking
        ```
    """
    return emit_event(
        event=BOOKING_COMPLETED,
        resource=booking_resource(booking.booking_id),
        payload={
            "gpu_sku": booking.gpu_sku,
            "node_count": booking.node_count,
            "gpus_per_node": booking.gpus_per_node,
            "fabric": booking.fabric,
            "region": booking.region,
        },
    )
