"""Scenarios: what the reference simulator holds on file and how its runs behave.

A scenario is plain data (JSON or YAML) validated by :class:`Scenario`. It names the bookings on
file, the run script every run on those bookings follows (stage plan, durations, gate scores, loss
spikes, interruptions, refusals, cost, a stall), optional per-booking changes to that script, and
the faults the HTTP layer injects. ``docs/simulator.md`` documents every field with an example.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from prefect_ito.contract import (
    ALL_SCOPES,
    ID_MAX_LENGTH,
    IDEMPOTENCY_KEY_RETENTION_SECONDS,
    BookingStatus,
    Scope,
    TrainingEligibility,
)

CURRICULUM_STAGES = ("pretrain", "mid_train", "long_context")
POST_TRAINING_STAGES = ("post_training.sft", "post_training.dpo", "post_training.rlvr")
DEFAULT_TIME_SCALE = 400_000.0
"""Simulated seconds per real second: the default run (about three weeks) takes about 5 s."""
DEFAULT_TERM_DAYS = 120
"""A booking's default term: long enough for the default run's estimate, from any date."""
DEFAULT_QUOTE_TTL_SECONDS = 900.0
"""How long a training quote stays confirmable, in real seconds (15 minutes)."""
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""The largest request body the simulator reads (1 MiB); a larger one is answered 413."""
DEFAULT_PAGE_ATTEMPT_LIMIT = 5
"""Wrong codes and passphrases a page takes per session, client or account within the window."""
DEFAULT_PAGE_ATTEMPT_WINDOW_SECONDS = 60.0
"""The window, in real seconds, in which a page counts wrong codes and passphrases."""


class _Spec(BaseModel):
    """Base for scenario models: strict, so a typo in a scenario file is an error, not a no-op.

    Every number is finite: a time, a rate or a loss of ``nan`` or ``inf`` is never meant, and
    would pass the bounds (``inf > 0``) only to break the clock or the run later.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SimBooking(_Spec):
    """A booking on file. The simulator never changes a booking's status by itself."""

    booking_id: str = Field(min_length=1, max_length=ID_MAX_LENGTH)
    status: BookingStatus
    gpu_sku: str = "H200"
    node_count: int = Field(default=2, ge=1)
    gpus_per_node: int = Field(default=8, ge=1)
    fabric: str = "InfiniBand"
    region: str = "eu-north-1"
    term_end: datetime = Field(
        default_factory=lambda: datetime.now(UTC) + timedelta(days=DEFAULT_TERM_DAYS),
        description=f"When the booking's term ends; default: {DEFAULT_TERM_DAYS} days after "
        "the scenario is made.",
    )
    account: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The account that holds the booking; other accounts are told it does not "
        "exist. None: on file for every account (a convenience of the simulator).",
    )

    @field_validator("status")
    @classmethod
    def _known_status(cls, status: BookingStatus) -> BookingStatus:
        # The contract's enum is open for answers; a scenario file must still spell it right.
        if not status.known:
            raise ValueError(f"unknown booking status {status.value!r}")
        return status

    @property
    def gpus(self) -> int:
        """Return the number of GPUs the booking holds."""
        return self.node_count * self.gpus_per_node

    def held_by(self, account: str) -> bool:
        """Tell whether ``account`` may see this booking."""
        return self.account is None or self.account == account

    def eligibility(self, account: str) -> TrainingEligibility:
        """Return the contract's view of this booking, for the account that holds it.

        Only completed bookings may train.
        """
        eligible = self.status is BookingStatus.COMPLETED
        reason = None if eligible else f"booking is {self.status.value}, not completed"
        fields = self.model_dump(exclude={"account"})
        return TrainingEligibility(**fields, eligible=eligible, reason=reason, account=account)


class SimPerson(_Spec):
    """A person who may sign in on the simulator's pages: an account and that person's secret.

    The secret is shown by no repr, log or page; a scenario written out as JSON holds it, as the
    scenario file it came from does.
    """

    account: str = Field(min_length=1, max_length=128)
    secret: SecretStr = Field(
        min_length=8, max_length=256, description="The passphrase the person signs in with."
    )

    @field_serializer("secret", when_used="json")
    def _written(self, secret: SecretStr) -> str:
        # A scenario's JSON is loaded again (PUT /_sim/scenario, a benchmark's child process):
        # a masked secret would quietly become every person's passphrase.
        return secret.get_secret_value()


def default_people() -> list[SimPerson]:
    """Return the people every scenario has unless it lists its own (docs/simulator.md)."""
    return [
        SimPerson(account=account, secret=SecretStr(f"{account}-passphrase"))
        for account in ("sim-user", "ada", "ana")
    ]


class EvalSpec(_Spec):
    """One eval of a gate's battery, with the score the simulated run will reach."""

    name: str
    metric: str = "accuracy"
    score: float
    threshold: float
    higher_is_better: bool = True

    @property
    def passed(self) -> bool:
        """Return whether the score clears the threshold in the eval's direction."""
        if self.higher_is_better:
            return self.score >= self.threshold
        return self.score <= self.threshold


class GateSpec(_Spec):
    """A stage's fixed eval battery."""

    battery: str
    evals: list[EvalSpec] = Field(min_length=1)


class StageSpec(_Spec):
    """A training stage: curriculum (``pretrain``…) or post-training (``post_training.sft``…)."""

    name: str
    hours: float = Field(gt=0, description="Simulated duration, without interruptions.")
    steps: int = Field(ge=1)
    loss_start: float = Field(gt=0)
    loss_end: float = Field(gt=0)
    gate: GateSpec | None = None

    @model_validator(mode="after")
    def _known_name(self) -> StageSpec:
        if self.name not in CURRICULUM_STAGES + POST_TRAINING_STAGES:
            raise ValueError(f"unknown stage {self.name!r}")
        return self


class _AtSpec(_Spec):
    """Something that happens at a fraction of a stage."""

    stage: str
    at_fraction: float = Field(gt=0, lt=1)


class SpikeSpec(_AtSpec):
    """A loss spike at a fraction of a stage: the run waits for a person's decision."""

    loss_factor: float = Field(default=3.0, gt=1, description="Spike loss over the baseline.")


class DeadlineSpec(_AtSpec):
    """A run's deadline at a fraction of a stage: a later one waits for a person's decision."""

    extend_hours: float = Field(default=12, gt=0, description="How much later, proposed.")


class InterruptionSpec(_AtSpec):
    """A node failure at a fraction of a stage, and how long detection and resumption take."""

    detect_seconds: float = Field(default=240, ge=0)
    resume_seconds: float = Field(default=540, ge=0)


class StallSpec(_AtSpec):
    """The workload silently stops at a fraction of a stage: no progress, no heartbeat."""


class RunScript(_Spec):
    """How every run on a booking behaves, on the simulated clock."""

    data_prep_hours: float = Field(default=6, gt=0)
    ladder_hours: float = Field(default=4, gt=0, description="The 150M ladder (custom data).")
    ladder_rejection: str | None = Field(default=None, description="Reject custom data, why.")
    parallelism_hours: float = Field(default=1, gt=0)
    parallelism_refusal: str | None = Field(default=None, description="Refuse the plan, why.")
    curriculum: list[StageSpec]
    post_training: list[StageSpec]
    segments_per_stage: int = Field(default=4, ge=1, le=50)
    gpu_hour_usd: float = Field(default=3.5, ge=0)
    tokens_per_step: int = Field(default=4_194_304, ge=1)
    checkpoint_bandwidth_gbps: float = Field(default=40.0, gt=0)
    rlvr_staleness_bound_steps: int = Field(default=4, ge=0)
    loss_spikes: list[SpikeSpec] = Field(default_factory=list)
    deadline_extensions: list[DeadlineSpec] = Field(default_factory=list)
    interruptions: list[InterruptionSpec] = Field(default_factory=list)
    stall: StallSpec | None = None
    cancel_seconds: float = Field(
        default=0, ge=0, description="Simulated seconds a cancel takes (`cancelling` meanwhile)."
    )

    @model_validator(mode="after")
    def _stage_names(self) -> RunScript:
        curriculum = [stage.name for stage in self.curriculum]
        post = [stage.name for stage in self.post_training]
        if not set(curriculum) <= set(CURRICULUM_STAGES) or len(set(curriculum)) != len(curriculum):
            raise ValueError(
                "curriculum stages must be distinct among " + ", ".join(CURRICULUM_STAGES)
            )
        if post != list(POST_TRAINING_STAGES[: len(post)]):
            raise ValueError("post_training must list sft, dpo, rlvr in order (a prefix)")
        return self


class Faults(_Spec):
    """Transport-level faults on ``/v0`` routes (never on ``/_sim``). Seeded, so repeatable."""

    seed: int = 0
    unavailable_rate: float = Field(default=0.0, ge=0, le=1, description="Share of 503s.")
    rate_limited_rate: float = Field(default=0.0, ge=0, le=1, description="Share of 429s.")
    internal_error_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of requests that fail with an exception (500)."
    )
    retry_after_seconds: int = Field(default=1, ge=0)
    latency_seconds: float = Field(default=0.0, ge=0, le=30)
    revoke_tokens_after_seconds: float | None = Field(
        default=None, ge=0, description="Real seconds after load; tokens issued before then die."
    )
    drop_response_after_commit: int = Field(
        default=0, ge=0, description="Drop the answer to this many new submissions, after commit."
    )
    commit_delay_seconds: float = Field(
        default=0.0,
        ge=0,
        le=30,
        description="Real seconds a keyed write (submit, decide, cancel) is in flight before it "
        "commits; the same key meanwhile gets 409 IDEMPOTENCY_KEY_IN_FLIGHT.",
    )


class Scenario(_Spec):
    """A complete simulator setup: bookings, run behaviour, faults and clock."""

    name: str = "custom"
    description: str = ""
    time_scale: float = Field(default=DEFAULT_TIME_SCALE, gt=0)
    scaffold: bool = Field(default=False, description="Answer like production today: not live.")
    change_feed: bool = Field(
        default=True,
        description="Serve and advertise the account-wide change feed; false answers like a "
        "backend without one (404), for watchers' per-run fallback.",
    )
    start_at: datetime | None = Field(
        default=None,
        description="The timestamp of the moment the scenario loads; default: the real time then.",
    )
    login_scopes: list[Scope] = Field(
        default_factory=lambda: list(ALL_SCOPES),
        description="The scopes a device login grants (default: every scope, the spend scopes "
        "included: a device login is a person's).",
    )
    device_interval_seconds: int = Field(default=1, ge=0)
    device_code_ttl_seconds: int = Field(default=600, ge=1)
    idempotency_key_retention_seconds: float = Field(
        default=IDEMPOTENCY_KEY_RETENTION_SECONDS,
        gt=0,
        description="Real seconds an idempotency key is kept after its first use.",
    )
    spend_confirmation: bool = Field(
        default=True,
        description="Advertise and require spend confirmations (contract v0.3); false answers "
        "like an older backend that takes none, which prefect-ito submits nothing to.",
    )
    client_reference: bool = Field(
        default=True,
        description="Advertise, keep and find client references (contract v0.3); false answers "
        "like an older backend: a submission carrying one is refused (422), as an unknown "
        "member, and the list filters by none.",
    )
    quote_ttl_seconds: float = Field(
        default=DEFAULT_QUOTE_TTL_SECONDS,
        gt=0,
        description="Real seconds a training quote can be confirmed after it was made.",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        ge=1,
        description="The largest request body read, in bytes; a larger one is answered "
        "413 PAYLOAD_TOO_LARGE while it arrives, never read whole.",
    )
    people: list[SimPerson] = Field(
        default_factory=default_people,
        description="Who may sign in on the simulator's pages, each with a passphrase; default: "
        "sim-user, ada and ana, each with the passphrase `<account>-passphrase`.",
    )
    page_attempt_limit: int = Field(
        default=DEFAULT_PAGE_ATTEMPT_LIMIT,
        ge=1,
        description="Wrong codes and passphrases a page takes from one session, one client "
        "address or one account within the window; the next attempt is answered 429.",
    )
    page_attempt_window_seconds: float = Field(
        default=DEFAULT_PAGE_ATTEMPT_WINDOW_SECONDS,
        gt=0,
        description="The window, in real seconds, in which wrong attempts are counted.",
    )
    bookings: list[SimBooking]
    run: RunScript
    booking_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="booking_id → RunScript fields replaced for it."
    )
    faults: Faults = Field(default_factory=Faults)

    @model_validator(mode="after")
    def _overrides_valid(self) -> Scenario:
        for booking_id in self.booking_overrides:
            self.script_for(booking_id)
        return self

    @model_validator(mode="after")
    def _one_secret_per_account(self) -> Scenario:
        accounts = [person.account for person in self.people]
        if len(set(accounts)) != len(accounts):
            raise ValueError("people: each account is listed once")
        return self

    def script_for(self, booking_id: str) -> RunScript:
        """Return the run script for a booking: the scenario's, with the booking's overrides."""
        override = self.booking_overrides.get(booking_id)
        if not override:
            return self.run
        return RunScript.model_validate({**self.run.model_dump(), **override})

    def with_options(
        self,
        *,
        scaffold: bool | None = None,
        time_scale: float | None = None,
        login_scopes: list[Scope] | None = None,
    ) -> Scenario:
        """Return a copy with the given command-line style overrides applied."""
        update: dict[str, Any] = {}
        if scaffold is not None:
            update["scaffold"] = scaffold
        if time_scale is not None:
            update["time_scale"] = time_scale
        if login_scopes is not None:
            update["login_scopes"] = login_scopes
        return self.model_validate({**self.model_dump(), **update})


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario from a JSON or YAML file.

    Args:
        path: A ``.json``, ``.yaml`` or ``.yml`` file.

    Returns:
        The validated scenario.

    Raises:
        ValueError: The file is not a valid scenario.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    raw: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return Scenario.model_validate(raw)
