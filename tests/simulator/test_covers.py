"""Table tests for ``covers(authorization, quote, now)``: which limit refuses which quote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from prefect_ito.contract import (
    CostRange,
    ParallelismPlan,
    PlanPreview,
    SpendAuthorization,
    SpendLimits,
    SpendUsage,
    TrainingQuote,
    TrainingRequest,
)
from prefect_ito.simulator.authorizations import covers

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _quote(**changes: Any) -> TrainingQuote:
    plan = PlanPreview(
        parallelism=ParallelismPlan(
            data=16, tensor=1, pipeline=1, expert=1, context=1, precision="bf16"
        ),
        stages=["data_prep", "parallelism", "pretrain"],
        custom_data=False,
        ladder_check=False,
        gpu_hours=CostRange(low=90, high=130),
        cost_usd=CostRange(low=900, high=1_300),
        duration_hours=CostRange(low=5, high=8),
    )
    manifest = TrainingRequest(
        booking_id="bk-nightly-1",
        model_size="8B",
        data_refs=["catalog://fineweb-edu"],
        target="chat assistant",
        budget_usd=2_000,
    )
    fields: dict[str, Any] = {
        "quote_id": "quote_1",
        "booking_id": manifest.booking_id,
        "manifest_digest": manifest.digest(),
        "budget_usd": manifest.budget_usd,
        "plan": plan,
        "within_budget": True,
        "term_end": NOW + timedelta(days=2),
        "ends_before_term": True,
        "expires_at": NOW + timedelta(minutes=15),
        "manifest": manifest,
    }
    fields.update(changes)
    return TrainingQuote(**fields)


def _authorization(state: str = "active", runs: int = 0, spend: float = 0, **limits: Any):
    limits.setdefault("data_ref_patterns", ["catalog://*"])
    return SpendAuthorization(
        authorization_id="sa_1",
        name="nightly",
        account="sim-user",
        principal="user:ada@example.com",
        limits=SpendLimits(**limits),
        created_at=NOW - timedelta(days=1),
        expires_at=NOW + timedelta(days=6),
        state=state,
        used=SpendUsage(runs=runs, spend_usd=spend),
    )


REFUSED_PLAN = ParallelismPlan(
    data=1,
    tensor=1,
    pipeline=1,
    expert=1,
    context=1,
    precision="bf16",
    refused=True,
    reason="too big",
)

CASES = [
    ("no limits", _authorization(), _quote(), None),
    (
        "every limit holds",
        _authorization(
            max_budget_usd=2_000,
            max_estimate_high_usd=1_300,
            model_sizes=["8B"],
            targets=["chat assistant"],
            booking_id_patterns=["bk-nightly-*"],
            total_spend_usd=4_000,
            max_runs=2,
        ),
        _quote(),
        None,
    ),
    ("revoked", _authorization(state="revoked"), _quote(), "is revoked"),
    ("exhausted", _authorization(state="exhausted"), _quote(), "is exhausted"),
    ("quote expired", _authorization(), _quote(expires_at=NOW), "quote expired"),
    (
        "plan refused",
        _authorization(),
        _quote(plan=_quote().plan.model_copy(update={"parallelism": REFUSED_PLAN})),
        "refuses the plan",
    ),
    ("outlasts the term", _authorization(), _quote(ends_before_term=False), "outlast"),
    ("budget per run", _authorization(max_budget_usd=1_999), _quote(), "budget $2,000.00"),
    ("estimate per run", _authorization(max_estimate_high_usd=1_000), _quote(), "estimate"),
    ("model size", _authorization(model_sizes=["70B"]), _quote(), "model size 8B"),
    ("target", _authorization(targets=["code"]), _quote(), "target"),
    ("booking pattern", _authorization(booking_id_patterns=["bk-prod-*"]), _quote(), "matches"),
    ("runs used", _authorization(runs=2, max_runs=2), _quote(), "runs are used"),
    (
        "total spend",
        _authorization(spend=3_000, total_spend_usd=4_000),
        _quote(),
        "past its total",
    ),
    ("no manifest to check", _authorization(targets=["x"]), _quote(manifest=None), "no manifest"),
    (
        "data pattern",
        _authorization(data_ref_patterns=["s3://team-bucket/corpus/*"]),
        _quote(),
        "the data 'catalog://fineweb-edu' matches none of",
    ),
    (
        "names no data (made before v0.5)",
        _authorization(data_ref_patterns=None),
        _quote(),
        "names no data",
    ),
    (
        "no manifest to check the data",
        _authorization(),
        _quote(manifest=None),
        "no manifest",
    ),
]


@pytest.mark.parametrize(
    ("authorization", "quote", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_covers(authorization, quote, expected):
    reason = covers(authorization, quote, NOW)

    if expected is None:
        assert reason is None
    else:
        assert reason is not None
        assert expected in reason


def test_an_authorization_past_its_expiry_covers_nothing_whatever_its_stated_state():
    authorization = _authorization().model_copy(update={"expires_at": NOW})

    assert "expired" in (covers(authorization, _quote(), NOW) or "")
