"""Confirming a spend: a person sees what would run and what it may cost, and confirms or declines.

Before anything is submitted, the backend quotes the request (:class:`TrainingQuote`: its plan,
its estimate, the manifest digest). :func:`confirm` then gets a :class:`SpendConfirmation` for
that quote:

- A plan the backend refuses stops at once, before anyone is asked: nothing is worth confirming.
- A standing authorization (:class:`~prefect_ito.blocks.ItoSpendAuthorization`) that covers the
  request confirms on behalf of the person who created it; one that does not is logged with
  every reason, and a person is asked.
- A person answers a typed :class:`SpendDecision` form, through the same pause or suspension a
  restart uses (:mod:`prefect_ito.asking`): a flow run from a deployment holds no process while
  the person thinks. The form shows the manifest digest filled in; an answer naming any other
  digest is refused, and so is a declined spend — in both cases nothing is submitted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, TypeAlias

from prefect import get_run_logger
from prefect.input import RunInput
from pydantic import Field

from prefect_ito import asking
from prefect_ito import markdown as md
from prefect_ito.blocks import ItoSpendAuthorization
from prefect_ito.cards import when
from prefect_ito.contract import (
    ConfirmationVia,
    CostRange,
    SpendConfirmation,
    TrainingQuote,
    TrainingRequest,
)
from prefect_ito.exceptions import (
    AwaitingConfirmation,
    ConfirmationMismatch,
    RunCancelled,
    RunRefused,
    SpendDeclined,
)

if TYPE_CHECKING:
    from prefect_ito.supervision import Logger

__all__ = [
    "SPEND_PREFIX",
    "SpendDecision",
    "accept",
    "ask_person",
    "confirm",
    "describe",
    "pause_key",
    "refuse_unworkable",
]

SPEND_PREFIX = "spend-"
"""Pause keys of spend confirmations start with this; the watcher never resumes such a pause."""

SHOWN_DATA_REFS = 3
"""Data references listed by name in the confirmation; the rest are counted."""

WHAT_EACH_ANSWER_DOES = (
    "confirm: the request is submitted once, and the backend records you as who confirmed. "
    "decline: nothing is submitted and the flow run ends Declined. There is no default."
)

_DIGEST = "The manifest digest you confirm, as shown above; any other is refused."

Ask: TypeAlias = Callable[[TrainingQuote, TrainingRequest], Awaitable[SpendConfirmation]]


class SpendDecision(RunInput):
    """A person's answer to a spend: an explicit choice, a name, and the digest confirmed.

    ``decision`` is required and has no default, so a form submitted untouched is refused by
    the Prefect UI and server instead of confirming (or declining) by accident.
    """

    decision: Literal["confirm", "decline"] = Field(
        title="Decision", description=WHAT_EACH_ANSWER_DOES
    )
    confirmed_by: str = Field(
        min_length=1, description="Your name, as the backend should record who confirmed."
    )
    manifest_digest: str = Field(description=_DIGEST)
    # Text with an empty default, not ``str | None``: the UI draws an optional type as a
    # str/None switch that starts on None, which reads as "no field here".
    reason: str = Field(default="", description="Why, if you like: it is logged.")


def pause_key(manifest_digest: str) -> str:
    """Return the pause key for confirming a manifest: stable across re-entries of a flow run."""
    return SPEND_PREFIX + manifest_digest.removeprefix("sha256:")[:16]


def refuse_unworkable(quote: TrainingQuote) -> None:
    """Stop when the backend's plan refuses the request: nothing is worth confirming.

    Raises:
        RunRefused: the same outcome as a refusal by a running backend; nothing was submitted.
    """
    parallelism = quote.plan.parallelism
    if parallelism.refused:
        raise RunRefused(
            f"the backend refuses the plan for booking {quote.booking_id}: "
            f"{parallelism.reason or 'no reason given'}; nothing was submitted"
        )


async def confirm(
    quote: TrainingQuote,
    request: TrainingRequest,
    *,
    authorization: ItoSpendAuthorization | None,
    ask: Ask,
    logger: Logger,
) -> SpendConfirmation:
    """Return the confirmation of ``quote``: under a standing authorization, or from a person.

    Raises:
        RunRefused: the backend refuses the plan; nobody was asked.
        SpendDeclined, ConfirmationMismatch, AwaitingConfirmation: from the person's answer.
    """
    refuse_unworkable(quote)
    for warning in quote.warnings:
        logger.warning("Quote %s: %s.", quote.quote_id, warning)
    if authorization is not None:
        reasons = authorization.not_covered(request, quote)
        if not reasons:
            logger.info(
                "Spend of up to $%s on booking %s confirmed on behalf of %s, under the standing "
                "authorization %s (manifest %s).",
                f"{request.budget_usd:,.2f}",
                request.booking_id,
                authorization.authorized_by,
                authorization.label,
                quote.manifest_digest,
            )
            return SpendConfirmation(
                quote_id=quote.quote_id,
                confirmed_by=authorization.authorized_by,
                via=ConfirmationVia.STANDING_AUTHORIZATION,
                authorization=authorization.label,
            )
        logger.warning(
            "The standing authorization %s does not cover this request: %s. Asking a person.",
            authorization.label,
            "; ".join(reasons),
        )
    return await ask(quote, request)


async def ask_person(
    quote: TrainingQuote, request: TrainingRequest, *, timeout: float, poll_interval: float
) -> SpendConfirmation:
    """Ask a person to confirm or decline the spend; return the confirmation.

    Raises:
        SpendDeclined: the person declined.
        ConfirmationMismatch: the answer names another manifest digest.
        AwaitingConfirmation: nobody answered in time.
        RunCancelled: the flow run was cancelled while it waited.
    """

    def waiting() -> None:
        get_run_logger().warning(
            "Waiting for a person to confirm or decline the spend of up to $%s on booking %s "
            "(manifest %s; in the Prefect UI: Resume). Nothing is submitted until then.",
            f"{request.budget_usd:,.2f}",
            request.booking_id,
            quote.manifest_digest,
        )

    def timed_out() -> AwaitingConfirmation:
        return AwaitingConfirmation(
            f"nobody confirmed the spend on booking {request.booking_id} "
            f"({quote.manifest_digest}) within {timeout:g} s; nothing was submitted, and "
            "running the flow again asks again"
        )

    answer = await asking.ask(
        SpendDecision,
        key=pause_key(quote.manifest_digest),
        description=describe(quote, request),
        timeout=timeout,
        poll_interval=poll_interval,
        waiting=waiting,
        timed_out=timed_out,
        # A Field rather than the bare value: the form keeps the field's description.
        initial={"manifest_digest": Field(default=quote.manifest_digest, description=_DIGEST)},
    )
    if answer is None:
        raise RunCancelled(
            "the flow run was cancelled while the spend waited for a person; nothing was submitted"
        )
    confirmation = accept(answer, quote)
    get_run_logger().info(
        "%s confirmed the spend (manifest %s)%s.",
        answer.confirmed_by,
        quote.manifest_digest,
        f": {answer.reason}" if answer.reason else "",
    )
    return confirmation


def accept(answer: SpendDecision, quote: TrainingQuote) -> SpendConfirmation:
    """Return the confirmation a person's answer gives for ``quote``.

    Raises:
        SpendDeclined: the person declined.
        ConfirmationMismatch: the answer names another manifest digest.
    """
    who = answer.confirmed_by
    if answer.decision == "decline":
        why = f": {answer.reason}" if answer.reason else ""
        raise SpendDeclined(
            f"{who} declined the spend on booking {quote.booking_id} "
            f"({quote.manifest_digest}){why}; nothing was submitted"
        )
    if answer.manifest_digest.strip() != quote.manifest_digest:
        raise ConfirmationMismatch(
            f"{who} confirmed manifest {answer.manifest_digest}, not this request's "
            f"{quote.manifest_digest}; nothing was submitted",
            field="manifest_digest",
        )
    return SpendConfirmation(quote_id=quote.quote_id, confirmed_by=who, via=ConfirmationVia.PERSON)


def describe(quote: TrainingQuote, request: TrainingRequest, *, choices: bool = True) -> str:
    """Return the markdown a person reads above the form: manifest, plan, estimate, choices.

    The Resume dialog is narrow and does not wrap table cells, so values stay short. Without
    ``choices`` (``prefect-ito quote``) the form's two answers are left out.
    """
    plan = quote.plan
    p = plan.parallelism
    outlast = "" if quote.ends_before_term else " — **the run may outlast it**"
    over = "" if quote.within_budget else " — **the estimate is above it**"
    lines = [
        f"### Confirm the spend: training on booking {md.code(quote.booking_id)}",
        "",
        "Nothing is submitted until the spend is confirmed; prefect-ito never confirms by itself.",
        "",
        "| manifest | value |",
        "|---|---|",
        f"| booking | {md.code(request.booking_id, cell=True)} |",
        f"| model size | {md.text(request.model_size)} |",
        f"| target | {md.text(request.target)} |",
        f"| data | {_data(request.data_refs)} |",
        f"| post-training | {request.post_training.value if request.post_training else 'none'} |",
        f"| budget | ${request.budget_usd:,.2f}{over} |",
        "",
        f"Manifest digest: {md.code(quote.manifest_digest)}",
        "",
        f"**The backend's plan**: data {p.data} × tensor {p.tensor} × pipeline {p.pipeline} × "
        f"expert {p.expert} × context {p.context}, {md.text(p.precision)}; stages "
        + " → ".join(md.text(stage) for stage in plan.stages)
        + ".",
        "",
        "Custom data: the 150M ladder checks it first, and may reject it."
        if plan.ladder_check
        else "Catalog data only: no ladder check.",
        "",
        "| estimate | low | high |",
        "|---|---|---|",
        f"| GPU hours | {_range(plan.gpu_hours, '{:,.0f}')} |",
        f"| cost | {_range(plan.cost_usd, '${:,.0f}')} |",
        f"| duration | {_range(plan.duration_hours, '{:,.0f} h')} |",
        "",
        f"The booking's term ends {when(quote.term_end)}{outlast}. "
        f"This quote expires {when(quote.expires_at)}.",
    ]
    if quote.warnings:
        lines += ["", "**Warnings:**", "", *(f"- {md.text(warning)}" for warning in quote.warnings)]
    if not choices:
        return "\n".join(lines)
    return "\n".join(
        [
            *lines,
            "",
            "**Choose one** — the form has no default:",
            "",
            "- **confirm**: the request above is submitted once; the backend records you as who "
            "confirmed, and spends up to the budget.",
            "- **decline**: nothing is submitted; the flow run ends Declined.",
        ]
    )


def _data(refs: list[str]) -> str:
    shown = ", ".join(md.code(ref, cell=True) for ref in refs[:SHOWN_DATA_REFS])
    more = len(refs) - SHOWN_DATA_REFS
    count = f"{len(refs)} reference{'s' if len(refs) != 1 else ''}"
    return f"{count}: {shown}" + (f" and {more} more" if more > 0 else "")


def _range(estimate: CostRange, template: str) -> str:
    return f"{template.format(estimate.low)} | {template.format(estimate.high)}"
