"""The one definition of what a caller asks prefect-ito to train, and how to supervise it.

:class:`TrainingParameters` is the ``training`` parameter of the ``ito-training`` flow, a field
of :class:`~prefect_ito.jobs.ItoTrainingJob`, the options of ``prefect-ito train`` (cyclopts
reads them from the fields, their types and descriptions) and what the cancellation paths and the
demo rebuild a request from. Adding a field means touching this model and the docs, nothing else.

Values arrive loosely typed — from the Prefect UI, a deployment, an event trigger, the command
line or Python — so every rule is checked here, before any backend call, and a broken rule is
reported as :class:`~prefect_ito.exceptions.InvalidParameters` naming the field.
"""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from typing import Annotated, Any, Literal, Self

from cyclopts import Parameter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefect_ito.backend.desk import BookingClaim
from prefect_ito.blocks import ItoBooking
from prefect_ito.contract import (
    ID_MAX_LENGTH,
    IDEMPOTENCY_KEY_PATTERN,
    MODEL_SIZE_PATTERN,
    TEXT_MAX_LENGTH,
    PostTraining,
    TrainingRequest,
    segment_problem,
)
from prefect_ito.exceptions import InvalidParameters, check_id, invalid_parameters

__all__ = [
    "IDEMPOTENCY_KEY_PATTERN",
    "BookingClaim",
    "SupervisionParameters",
    "TrainingParameters",
    "check_id",
    "derive_idempotency_key",
    "invalid_parameters",
    "resolve_booking",
]

_MODEL_SIZE = re.compile(MODEL_SIZE_PATTERN)
_KEY_NAMESPACE = uuid.UUID("5d1c1f0e-8f57-4c57-9a59-3f0b8e3e1c2a")
"""A submission key a caller gives: 1–255 letters, digits or ``._:-``, starting with one of the
first two (the contract allows any 1–255 characters; prefect-ito keeps keys shell- and log-safe)."""
_SHOWN_LENGTH = 40
"""The most characters of a rejected value a message repeats: a huge value stays out of it."""


def _booking_id_token(type_: Any, tokens: Any) -> str:
    # On the command line a booking is always its id; an ItoBooking comes only from Python.
    return str(tokens[0].value)


class SupervisionParameters(BaseModel):
    """How long prefect-ito supervises a backend run, and how long a person has to decide."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval_timeout: int = Field(
        kw_only=True,
        default=86_400,
        description="Seconds a person has to decide on a proposed restart.",
        json_schema_extra={"exclusiveMinimum": 0},
    )
    deadline: float | None = Field(
        kw_only=True,
        default=None,
        description="Seconds supervision may last before it stops; the backend run goes on "
        "and running the flow again re-attaches. Default: no deadline.",
    )
    mode: Literal["auto", "deferred", "in-process"] = Field(
        kw_only=True,
        default="auto",
        description="How to wait while the backend works: deferred suspends the flow run and "
        "holds no process (a `prefect-ito watch` resumes it when the run changes; needs a flow "
        "run from a deployment); in-process keeps waiting in the flow's process; auto defers "
        "exactly when it can.",
    )
    defer_after: float = Field(
        kw_only=True,
        default=30,
        description="Deferred mode: seconds to wait in the flow's process for a gate before "
        "suspending (a short wait costs less than starting a flow process again).",
    )
    stall_timeout: float | None = Field(
        kw_only=True,
        default=3_600,
        description="Seconds without a backend heartbeat before supervision stops as Stalled.",
    )

    @field_validator("approval_timeout", "deadline", "stall_timeout", "defer_after", mode="before")
    @classmethod
    def _positive_seconds(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"must be a number of seconds (got {_shown(value)})")
        seconds = _number(value)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"must be a finite positive number of seconds (got {_shown(value)})")
        return value

    @classmethod
    def parse(cls, value: Self | dict[str, Any] | None) -> Self:
        """Return ``value`` as validated parameters.

        Raises:
            InvalidParameters: naming the first field that breaks a rule, and the rule.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value or {})
        except ValidationError as exc:
            raise invalid_parameters(exc) from None


class _Request(BaseModel):
    """The fields of a request, before the limits of :class:`SupervisionParameters`.

    A base of its own only so that forms and ``--help`` list what to train before how long to
    supervise it (pydantic orders inherited fields base by base).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    booking: Annotated[
        ItoBooking | str | None,
        Parameter(n_tokens=1, accepts_keys=False, converter=_booking_id_token),
    ] = Field(
        kw_only=True,
        default=None,
        description="The completed booking's id (or, from Python, an ItoBooking). "
        "Give this or booking_block.",
    )
    booking_block: str | None = Field(
        kw_only=True,
        default=None,
        description="Instead of booking: the name of a saved ItoBooking block.",
    )
    model_size: str = Field(
        kw_only=True,
        description="Parameter count such as 150M, 8B or 70B.",
        json_schema_extra={"pattern": MODEL_SIZE_PATTERN},
    )
    data: Annotated[list[str], Parameter(negative=())] = Field(
        kw_only=True,
        description="Data references to train on; at least one. Anything not under "
        "catalog:// is custom data and goes through the 150M ladder pre-check. On the "
        "command line, repeat --data, or give --data-file with one reference a line.",
        json_schema_extra={"minItems": 1},
    )
    target: str = Field(
        kw_only=True, description="The capability to train for, e.g. code-assistant."
    )
    budget_usd: float = Field(
        kw_only=True,
        title="Budget (USD)",
        description="Spend ceiling in US dollars: finite and positive.",
        json_schema_extra={"exclusiveMinimum": 0},
    )
    post_training: Literal["sft", "dpo", "rlvr"] | None = Field(
        kw_only=True,
        default=None,
        description="Post-training up to and including this recipe: sft, dpo or rlvr "
        "(the pipeline SFT → DPO → RLVR). Default: none.",
    )
    idempotency_key: str | None = Field(
        kw_only=True,
        default=None,
        description="The submission's idempotency key: 1 to 255 letters, digits or ._:- "
        "starting with a letter or digit. The same key again finds the run it created instead "
        "of submitting another (for 24 hours at least). Default: derived from booking, manifest "
        "and flow run.",
        json_schema_extra={"pattern": IDEMPOTENCY_KEY_PATTERN},
    )

    @field_validator("post_training", mode="before")
    @classmethod
    def _recipe(cls, value: Any) -> Any:
        if value is None or value == "none":
            return None
        if value not in {"sft", "dpo", "rlvr"}:
            raise ValueError(f"must be one of sft, dpo, rlvr or none (got {_shown(value)})")
        return value

    @field_validator("model_size", mode="before")
    @classmethod
    def _model_size(cls, value: Any) -> Any:
        if not isinstance(value, str) or not _MODEL_SIZE.match(value):
            raise ValueError(
                f"must be a parameter count like 150M, 8B or 70B (got {_shown(value)})"
            )
        return value

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value or not all(_is_text(ref) for ref in value):
            raise ValueError("give at least one data reference, each a non-empty string")
        return [_clean(ref, TEXT_MAX_LENGTH, f"reference {n + 1}") for n, ref in enumerate(value)]

    @field_validator("target", "booking_block", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if value is not None and not _is_text(value):
            raise ValueError(f"must be a non-empty string (got {_shown(value)})")
        return _clean(value, TEXT_MAX_LENGTH) if isinstance(value, str) else value

    @field_validator("booking", mode="before")
    @classmethod
    def _booking(cls, value: Any) -> Any:
        if value is None or isinstance(value, ItoBooking):
            return value
        if _is_text(value):
            booking_id = _clean(value, ID_MAX_LENGTH)
            problem = segment_problem(booking_id)
            if problem is not None:
                raise ValueError(problem)
            return booking_id
        if isinstance(value, dict):
            return ItoBooking.model_validate(value)
        raise ValueError(f"must be a booking id or an ItoBooking (got {_shown(value)})")

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        amount = None if isinstance(value, bool) else _number(value)
        if amount is None or not math.isfinite(amount) or amount <= 0:
            raise ValueError(
                f"must be a finite positive amount of US dollars (got {_shown(value)})"
            )
        return amount

    @field_validator("idempotency_key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        well_formed = isinstance(value, str) and re.match(IDEMPOTENCY_KEY_PATTERN, value)
        if value is not None and not well_formed:
            raise ValueError(
                "must be 1 to 255 letters, digits or ._:- starting with a letter or digit"
            )
        return value


class TrainingParameters(SupervisionParameters, _Request):
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

    @model_validator(mode="after")
    def _one_booking(self) -> TrainingParameters:
        if (self.booking is None) == (self.booking_block is None):
            raise ValueError(
                "booking / booking_block: give exactly one, a booking (a booking id or an "
                "ItoBooking) or the name of a saved ItoBooking block"
            )
        return self

    def to_request(self, claim: BookingClaim) -> TrainingRequest:
        """Return the training request the manifest digest covers, for the booking ``claim``."""
        try:
            return TrainingRequest(
                booking_id=claim.booking_id,
                model_size=self.model_size,
                data_refs=self.data,
                target=self.target,
                budget_usd=self.budget_usd,
                post_training=PostTraining(self.post_training) if self.post_training else None,
            )
        except ValidationError as exc:
            raise invalid_parameters(exc) from None


def claim_booking(booking: ItoBooking | str) -> BookingClaim:
    """Return the claim an ``ItoBooking`` or a bare booking id makes."""
    if isinstance(booking, str):
        return BookingClaim(booking_id=booking)
    if not _is_text(booking.booking_id):
        raise InvalidParameters("booking.booking_id: must be a non-empty string")
    try:
        booking_id = _clean(booking.booking_id, ID_MAX_LENGTH)
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


async def resolve_booking(parameters: TrainingParameters) -> BookingClaim:
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


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _clean(text: str, limit: int, what: str = "") -> str:
    """Return ``text`` without surrounding blanks; refuse control characters and excess length.

    Ids, references and targets reach logs, terminals and the backend: a control character in
    one (an escape sequence, a NUL, a line break inside it) is never meant, and would garble each.
    """
    stripped = text.strip()
    where = f"{what} " if what else ""
    control = next((c for c in stripped if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        raise ValueError(
            f"{where}must not contain control characters (got U+{ord(control):04X} in "
            f"{_shown(stripped)})"
        )
    if len(stripped) > limit:
        raise ValueError(f"{where}must be at most {limit} characters (got {len(stripped):,})")
    return stripped


def _shown(value: Any) -> str:
    """Return ``repr(value)``, cut short: a message names a bad value without repeating it all."""
    shown = repr(value)
    if len(shown) <= _SHOWN_LENGTH:
        return shown
    return f"{shown[:_SHOWN_LENGTH]}… ({len(shown):,} characters)"
