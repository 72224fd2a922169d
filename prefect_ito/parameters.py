"""The one definition of what a caller asks prefect-ito to train, and how to supervise it.

:class:`TrainingParameters` is the ``training`` parameter of the ``ito-training`` flow, a field
of :class:`~prefect_ito.jobs.ItoTrainingJob`, the options of ``prefect-ito train`` and
``prefect-ito quote`` (cyclopts reads them from the fields, their types and descriptions) and what
the cancellation paths and the demo rebuild a request from. Its fields and their rules are
:class:`~prefect_ito.request_fields.TrainingFields`, free of Prefect; here the booking may also
be an :class:`~prefect_ito.blocks.ItoBooking` (so the Prefect UI offers a block selector), and a
saved booking block is read.
"""

from __future__ import annotations

import uuid
from typing import Any

from prefect_ito.backend.desk import BookingClaim
from prefect_ito.blocks import ItoBooking
from prefect_ito.contract import ID_MAX_LENGTH, IDEMPOTENCY_KEY_PATTERN, TrainingRequest
from prefect_ito.exceptions import InvalidParameters, check_id, invalid_parameters
from prefect_ito.request_fields import (
    SupervisionParameters,
    TrainingFields,
    clean_text,
    is_text,
    shown,
)

__all__ = [
    "IDEMPOTENCY_KEY_PATTERN",
    "BookingClaim",
    "SupervisionParameters",
    "TrainingParameters",
    "check_id",
    "derive_idempotency_key",
    "invalid_parameters",
    "resolve_booking",
    "submission_key",
]

_KEY_NAMESPACE = uuid.UUID("5d1c1f0e-8f57-4c57-9a59-3f0b8e3e1c2a")
"""A submission key a caller gives: 1–255 letters, digits or ``._:-``, starting with one of the
first two (the contract allows any 1–255 characters; prefect-ito keeps keys shell- and log-safe)."""


class TrainingParameters(TrainingFields[ItoBooking | str]):
    """A training request for a completed booking, and how to supervise it.

    Example:
        ```python
        from prefect_ito.flows import ito_training
        from prefect_ito.parameters import TrainingParameters

        await ito_training(
            TrainingParameters(
                booking="bk-123", model_size="8B", data=["catalog://ito/web-2026-10"],
                target="code-assistant", budget_usd=250_000, post_training="rlvr",
            ),
            credentials="desk",
        )
        ```
    """

    @classmethod
    def _other_booking(cls, value: Any) -> Any:
        if isinstance(value, ItoBooking):
            return value
        if isinstance(value, dict):
            return ItoBooking.model_validate(value)
        raise ValueError(f"must be a booking id or an ItoBooking (got {shown(value)})")


def claim_booking(booking: ItoBooking | str) -> BookingClaim:
    """Return the claim an ``ItoBooking`` or a bare booking id makes."""
    if isinstance(booking, str):
        return BookingClaim(booking_id=booking)
    if not is_text(booking.booking_id):
        raise InvalidParameters("booking.booking_id: must be a non-empty string")
    try:
        booking_id = clean_text(booking.booking_id, ID_MAX_LENGTH)
    except ValueError as exc:
        raise InvalidParameters(f"booking.booking_id: {exc}") from None
    return BookingClaim(
        booking_id=booking_id,
        gpu_sku=booking.gpu_sku,
        node_count=booking.node_count,
        gpus_per_node=booking.gpus_per_node,
        fabric=booking.fabric,
        region=booking.region,
        account=booking.account,
    )


async def resolve_booking(parameters: TrainingFields[Any]) -> BookingClaim:
    """Return the booking claim of ``parameters``: the booking given, or the block named.

    A string in ``booking`` is always a booking id, and ``booking_block`` always a block name:
    neither is guessed to be the other.

    Raises:
        InvalidParameters: the named block cannot be loaded.
    """
    if parameters.booking is not None:
        return claim_booking(parameters.booking)
    name = parameters.booking_block or ""
    try:
        loaded = await ItoBooking.aload(name)
    except ValueError as exc:
        raise InvalidParameters(f"booking_block: no ItoBooking block named {name!r}") from exc
    return claim_booking(loaded)


def derive_idempotency_key(request: TrainingRequest, flow_run_id: uuid.UUID | str | None) -> str:
    """Return the submission's idempotency key.

    It is derived from the booking, the manifest digest and the flow run, so Prefect retries and
    re-entries of one flow run resend the same key, while the next scheduled run gets a new one.
    Outside a flow run a fresh key is made: the caller is then one logical submission.
    """
    anchor = str(flow_run_id) if flow_run_id is not None else uuid.uuid4().hex
    name = f"{request.booking_id}|{request.digest()}|{anchor}"
    return f"ito-train-{uuid.uuid5(_KEY_NAMESPACE, name)}"


def quote_submission_key(quote_id: str) -> str:
    """Return the idempotency key of the one submission a confirmed quote ``quote_id`` makes.

    ``train --confirm QUOTE_ID`` submits under it, so the same command run again after its
    process was killed finds the run that quote made, and follows it, rather than stop on a
    quote that is used.
    """
    return f"ito-train-{uuid.uuid5(_KEY_NAMESPACE, f'quote|{quote_id}')}"


def submission_key(
    training: TrainingParameters, request: TrainingRequest, flow_run_id: uuid.UUID | str | None
) -> str:
    """Return the idempotency key a flow run submits ``request`` under: the one its parameters
    give, else :func:`derive_idempotency_key`'s. A cancel finds the run by the same key."""
    return training.idempotency_key or derive_idempotency_key(request, flow_run_id)
