"""A quote as a person reads it: the cost, the ceiling and the term first; then where to
confirm; then the plan.

The Prefect form of a spend, the terminal's prompt, ``prefect-ito quote`` and ``prefect-ito
confirm`` all show a quote with :func:`describe`, so a person reads the same thing wherever they
are asked. Pure text: nothing here imports Prefect.
"""

from __future__ import annotations

from prefect_ito.contract import CostRange, QuoteState, TrainingQuote, TrainingRequest
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.moments import when

__all__ = ["SHOWN_DATA_REFS", "describe", "estimate", "short_usd", "spend_question"]

SHOWN_DATA_REFS = 3
"""Data references listed by name; the rest are counted."""


def describe(
    quote: TrainingQuote,
    request: TrainingRequest,
    *,
    choices: bool = True,
    why: str | None = None,
) -> str:
    """Return the markdown a person reads above the form: cost first, then where to confirm.

    The Resume dialog shows the description in a box about 290 px high: its first lines say
    the estimate, the ceiling and the booking's term, and the estimate's table follows; the
    manifest and the plan are below. The dialog is narrow and does not wrap table cells, so
    values stay short. Without ``choices`` (``prefect-ito quote``) the form's answers are left
    out. ``why`` says, right under the heading, why a person is asked now.
    """
    plan = quote.plan
    p = plan.parallelism
    over = "" if quote.within_budget else " — **the estimate is above it**"
    lines = [
        f"### Spend on booking {md.code(quote.booking_id)}: {estimate(quote)} estimated, "
        f"${request.budget_usd:,.0f} at most{over}",
        "",
        *([f"**Why you are asked:** {md.text(why)}.", ""] if why else []),
        _term(quote),
        "",
        "| estimate | low | high |",
        "|---|---|---|",
        f"| cost | {_range(plan.cost_usd, '${:,.0f}')} |",
        f"| GPU hours | {_range(plan.gpu_hours, '{:,.0f}')} |",
        f"| duration | {_range(plan.duration_hours, '{:,.0f} h')} |",
        "",
        *_where_to_confirm(quote, choices),
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
    ]
    if quote.not_carried:
        lines += [
            "",
            "**Asked again — what changed since the last confirmation:**",
            "",
            *(f"- {md.text(change)}" for change in quote.not_carried),
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
            "- **decline**: nothing is submitted; the quote is declined at the backend and the "
            "flow run ends Declined.",
            "- **recheck**: you confirmed on the backend's page; the flow reads the quote again.",
        ]
    )


def estimate(quote: TrainingQuote) -> str:
    """Return the quote's cost estimate as said in one breath: ``$23k–$34k``."""
    cost = quote.plan.cost_usd
    low, high = short_usd(cost.low), short_usd(cost.high)
    return low if low == high else f"{low}–{high}"


def short_usd(amount: float) -> str:
    """Return an amount of US dollars rounded as a person says it: ``$950``, ``$23k``, ``$1.2M``."""
    if amount >= 1e6:
        return f"${amount / 1e6:,.1f}M"
    if amount >= 1e4:
        return f"${amount / 1e3:,.0f}k"
    return f"${amount:,.0f}"


def spend_question(quote: TrainingQuote) -> str:
    """Return what a person is asked about a spend, in a few words: for a state, a notice."""
    return f"confirm the spend of {estimate(quote)} on booking {quote.booking_id}"


def _term(quote: TrainingQuote) -> str:
    """Return the line on the booking's term, the quote's expiry, and what waiting costs."""
    outlast = "" if quote.ends_before_term else " — **the run may outlast it**"
    hourly = quote.booking_usd_per_hour
    held = (
        f" While this question waits, the booking costs ${hourly:,.0f} an hour." if hourly else ""
    )
    return (
        f"The booking's term ends {when(quote.term_end)}{outlast}. "
        f"This quote expires {when(quote.expires_at)}.{held}"
    )


def _where_to_confirm(quote: TrainingQuote, choices: bool) -> list[str]:
    """Return the lines that say where a person confirms: the backend's page and code."""
    answer = quote.confirmation
    if quote.state in (QuoteState.CONFIRMED, QuoteState.DECLINED) and answer is not None:
        return [
            f"{quote.state.value.capitalize()} at the backend by {md.code(answer.principal)}.",
            "",
        ]
    # The address is shown too: a terminal shows a link's text, not where it points.
    where = (
        f"[the backend's confirm page]({quote.confirm_url}) ({md.code(quote.confirm_url)})"
        if quote.confirm_url and md.is_http_url(quote.confirm_url)
        else "the backend's confirm page"
    )
    code = f", code {md.code(quote.user_code)}" if quote.user_code else ""
    lines = [
        f"**To confirm, sign in on {where}{code}** — the backend records who you are. "
        "Nothing here confirms a spend, and prefect-ito never confirms by itself.",
        "",
    ]
    if not choices:
        lines[0] = f"Quote {md.code(quote.quote_id)}: a person confirms it on {where}{code}."
    return lines


def _data(refs: list[str]) -> str:
    shown = ", ".join(md.code(ref, cell=True) for ref in refs[:SHOWN_DATA_REFS])
    more = len(refs) - SHOWN_DATA_REFS
    count = f"{len(refs)} reference{'s' if len(refs) != 1 else ''}"
    return f"{count}: {shown}" + (f" and {more} more" if more > 0 else "")


def _range(estimate: CostRange, template: str) -> str:
    return f"{template.format(estimate.low)} | {template.format(estimate.high)}"
