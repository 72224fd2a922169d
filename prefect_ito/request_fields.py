"""Every field of a training request and of its supervision, and their rules, without Prefect.

:class:`TrainingFields` holds them; :class:`~prefect_ito.parameters.TrainingParameters`, the
``training`` parameter of the ``ito-training`` flow, is ``TrainingFields[ItoBooking | str]``:
the same fields and rules, with an ``ItoBooking`` block accepted as the booking beside its id.
The command line takes a booking by its id only (``TrainingFields[str]``), so ``prefect-ito
quote`` checks a request exactly as the flow would without importing Prefect (about two
seconds). Adding a field means touching this model and the docs, nothing else.

Values arrive loosely typed — from the Prefect UI, a deployment, an event trigger, the command
line or Python — so every rule is checked here, before any backend call, and a broken rule is
reported as :class:`~prefect_ito.exceptions.InvalidParameters` naming the field.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from cyclopts import Parameter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefect_ito.backend.desk import BookingClaim
from prefect_ito.contract import (
    ID_MAX_LENGTH,
    IDEMPOTENCY_KEY_PATTERN,
    MODEL_SIZE_PATTERN,
    TEXT_MAX_LENGTH,
    PostTraining,
    TrainingRequest,
    hidden_character,
    segment_problem,
    shown,
)
from prefect_ito.exceptions import invalid_parameters

__all__ = ["SupervisionParameters", "TrainingFields", "clean_text", "is_text", "shown"]

BookingT = TypeVar("BookingT")
"""What a booking may be beside its id: ``str`` alone on the command line."""

_MODEL_SIZE = re.compile(MODEL_SIZE_PATTERN)


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
            raise ValueError(f"must be a number of seconds (got {shown(value)})")
        seconds = _number(value)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"must be a finite positive number of seconds (got {shown(value)})")
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


class _Request(BaseModel, Generic[BookingT]):
    """The fields of a request, before the limits of :class:`SupervisionParameters`.

    A base of its own only so that forms and ``--help`` list what to train before how long to
    supervise it (pydantic orders inherited fields base by base).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    booking: Annotated[
        BookingT | None,
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
            raise ValueError(f"must be one of sft, dpo, rlvr or none (got {shown(value)})")
        return value

    @field_validator("model_size", mode="before")
    @classmethod
    def _model_size(cls, value: Any) -> Any:
        if not isinstance(value, str) or not _MODEL_SIZE.match(value):
            raise ValueError(f"must be a parameter count like 150M, 8B or 70B (got {shown(value)})")
        return value

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value or not all(is_text(ref) for ref in value):
            raise ValueError("give at least one data reference, each a non-empty string")
        return [
            clean_text(ref, TEXT_MAX_LENGTH, f"reference {n + 1}") for n, ref in enumerate(value)
        ]

    @field_validator("target", "booking_block", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if value is not None and not is_text(value):
            raise ValueError(f"must be a non-empty string (got {shown(value)})")
        return clean_text(value, TEXT_MAX_LENGTH) if isinstance(value, str) else value

    @field_validator("booking", mode="before")
    @classmethod
    def _booking(cls, value: Any) -> Any:
        if value is None:
            return value
        if is_text(value):
            booking_id = clean_text(value, ID_MAX_LENGTH)
            problem = segment_problem(booking_id)
            if problem is not None:
                raise ValueError(problem)
            return booking_id
        return cls._other_booking(value)

    @classmethod
    def _other_booking(cls, value: Any) -> Any:
        """Return ``value``, a booking that is not an id, as the booking; here none is."""
        raise ValueError(f"must be a booking id (got {shown(value)})")

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        amount = None if isinstance(value, bool) else _number(value)
        if amount is None or not math.isfinite(amount) or amount <= 0:
            raise ValueError(f"must be a finite positive amount of US dollars (got {shown(value)})")
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


class TrainingFields(SupervisionParameters, _Request[BookingT], Generic[BookingT]):
    """A training request for a completed booking, and how to supervise it.

    ``BookingT`` is what the booking may be beside its id; whatever it is, exactly one of
    ``booking`` and ``booking_block`` is given.
    """

    @model_validator(mode="after")
    def _one_booking(self) -> Self:
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


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def is_text(value: Any) -> bool:
    """Tell whether ``value`` is a string with more than blanks in it."""
    return isinstance(value, str) and bool(value.strip())


def clean_text(text: str, limit: int, what: str = "") -> str:
    """Return ``text`` without surrounding blanks; refuse control or invisible characters and
    excess length.

    Ids, references and targets reach logs, terminals, forms and the backend: a control
    character in one (an escape sequence, a NUL, a line break inside it) would garble each, and
    an invisible one (a bidi override, a zero-width space) makes it read as another.

    Raises:
        ValueError: naming ``what`` (when given) and the rule ``text`` breaks.
    """
    stripped = text.strip()
    where = f"{what} " if what else ""
    control = hidden_character(stripped)
    if control is not None:
        raise ValueError(
            f"{where}must not contain control or invisible characters (got U+{ord(control):04X} "
            f"in {shown(stripped)})"
        )
    if len(stripped) > limit:
        raise ValueError(f"{where}must be at most {limit} characters (got {len(stripped):,})")
    return stripped
