"""Turning what a caller asks for into a validated training request, before any backend call.

Flow parameters arrive loosely typed (from the UI, a deployment, an event trigger or Python), so
every rule is checked here and reported with the parameter's name and the rule it broke.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from prefect_ito.blocks import ItoBooking
from prefect_ito.contract import MODEL_SIZE_PATTERN, PostTraining, TrainingRequest
from prefect_ito.exceptions import InvalidParameters

_MODEL_SIZE = re.compile(MODEL_SIZE_PATTERN)
_KEY_NAMESPACE = uuid.UUID("5d1c1f0e-8f57-4c57-9a59-3f0b8e3e1c2a")


class BookingClaim(BaseModel):
    """What the caller says about the booking; only the backend's answer proves it."""

    model_config = ConfigDict(frozen=True)

    booking_id: str
    gpu_sku: str | None = None
    node_count: int | None = None
    fabric: str | None = None

    @classmethod
    def from_booking(cls, booking: ItoBooking | str) -> BookingClaim:
        """Return the claim an ``ItoBooking`` or a bare booking id makes."""
        if isinstance(booking, str):
            return cls(booking_id=_require_text("booking", booking))
        return cls(
            booking_id=_require_text("booking.booking_id", booking.booking_id),
            gpu_sku=booking.gpu_sku,
            node_count=booking.node_count,
            fabric=booking.fabric,
        )


async def resolve_booking(
    booking: ItoBooking | str | None, booking_block: str | None
) -> BookingClaim:
    """Return the booking claim from exactly one of ``booking`` and ``booking_block``.

    A string in ``booking`` is always a booking id, and ``booking_block`` always a block name:
    neither is guessed to be the other.

    Raises:
        InvalidParameters: when both or neither are given, or the block cannot be loaded.
    """
    if (booking is None) == (booking_block is None):
        raise InvalidParameters(
            "booking / booking_block: give exactly one — a booking (an ItoBooking or a booking "
            "id) or the name of a saved ItoBooking block"
        )
    if booking is not None:
        return BookingClaim.from_booking(booking)
    try:
        loaded = await ItoBooking.aload(_require_text("booking_block", booking_block or ""))
    except ValueError as exc:
        raise InvalidParameters(
            f"booking_block: no ItoBooking block named {booking_block!r}"
        ) from exc
    return BookingClaim.from_booking(loaded)


def build_request(
    claim: BookingClaim,
    *,
    model_size: str,
    data: list[str],
    target: str,
    budget_usd: float,
    post_training: str | None,
) -> TrainingRequest:
    """Check every rule and return the training request the manifest digest covers.

    Raises:
        InvalidParameters: naming the first parameter that breaks a rule, and the rule.
    """
    if not isinstance(model_size, str) or not _MODEL_SIZE.match(model_size):
        raise InvalidParameters(
            f"model_size: must be a parameter count like 150M, 8B or 70B (got {model_size!r})"
        )
    if not isinstance(data, list) or not data or not all(_is_text(ref) for ref in data):
        raise InvalidParameters("data: give at least one data reference, each a non-empty string")
    target = _require_text("target", target)
    if isinstance(budget_usd, bool) or not isinstance(budget_usd, int | float):
        raise InvalidParameters(f"budget_usd: must be a number of US dollars (got {budget_usd!r})")
    if not math.isfinite(budget_usd) or budget_usd <= 0:
        raise InvalidParameters(
            f"budget_usd: must be a finite positive amount of US dollars (got {budget_usd!r})"
        )
    recipe = _recipe(post_training)
    try:
        return TrainingRequest(
            booking_id=claim.booking_id,
            model_size=model_size,
            data_refs=data,
            target=target,
            budget_usd=float(budget_usd),
            post_training=recipe,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InvalidParameters(f"{field}: {first['msg']}") from None


def derive_idempotency_key(request: TrainingRequest, flow_run_id: uuid.UUID | str | None) -> str:
    """Return the submission's idempotency key.

    It is derived from the booking, the manifest digest and the flow run, so Prefect retries and
    re-entries of one flow run resend the same key, while the next scheduled run gets a new one.
    Outside a flow run a fresh key is made: the caller is then one logical submission.
    """
    anchor = str(flow_run_id) if flow_run_id is not None else uuid.uuid4().hex
    name = f"{request.booking_id}|{request.digest()}|{anchor}"
    return f"ito-train-{uuid.uuid5(_KEY_NAMESPACE, name)}"


def _recipe(value: str | None) -> PostTraining | None:
    if value is None or value == "none":
        return None
    try:
        return PostTraining(value)
    except ValueError:
        raise InvalidParameters(
            f"post_training: must be one of sft, dpo, rlvr or none (got {value!r})"
        ) from None


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _require_text(name: str, value: Any) -> str:
    if not _is_text(value):
        raise InvalidParameters(f"{name}: must be a non-empty string (got {value!r})")
    return str(value).strip()
