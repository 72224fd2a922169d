"""Standing spend authorizations (contract v0.4): backend objects a person creates.

:class:`AuthorizationBook` keeps an account's authorizations, with what each has used;
:func:`covers` says whether one covers a quote, and :meth:`AuthorizationBook.charge` is what a
new run under one calls, in the same step that creates it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase

from prefect_ito.contract import (
    ErrorCode,
    SpendAuthorization,
    SpendAuthorizationRequest,
    SpendAuthorizationState,
    SpendUsage,
    TrainingQuote,
    data_ref_ambiguity,
    data_ref_matches,
)
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.ids import mint


@dataclass
class _Kept:
    """One authorization as created, and what has happened to it since."""

    authorization_id: str
    account: str
    principal: str
    request: SpendAuthorizationRequest
    created_at: datetime
    runs: int = 0
    spend_usd: float = 0.0
    revoked_at: datetime | None = None
    revoked_by: str | None = None

    def state(self, now: datetime) -> SpendAuthorizationState:
        limits = self.request.limits
        if self.revoked_at is not None:
            return SpendAuthorizationState.REVOKED
        if now >= self.request.expires_at:
            return SpendAuthorizationState.EXPIRED
        runs_used = limits.max_runs is not None and self.runs >= limits.max_runs
        spend_used = limits.total_spend_usd is not None and self.spend_usd >= limits.total_spend_usd
        if runs_used or spend_used:
            return SpendAuthorizationState.EXHAUSTED
        return SpendAuthorizationState.ACTIVE

    def stated(self, now: datetime) -> SpendAuthorization:
        return SpendAuthorization(
            authorization_id=self.authorization_id,
            name=self.request.name,
            account=self.account,
            principal=self.principal,
            limits=self.request.limits,
            created_at=self.created_at,
            expires_at=self.request.expires_at,
            state=self.state(now),
            used=SpendUsage(runs=self.runs, spend_usd=self.spend_usd),
            revoked_at=self.revoked_at,
            revoked_by=self.revoked_by,
        )


@dataclass
class AuthorizationBook:
    """The standing authorizations of every account, and the idempotency keys that made them."""

    _kept: dict[str, _Kept] = field(default_factory=dict)
    _keys: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def create(
        self,
        account: str,
        principal: str,
        request: SpendAuthorizationRequest,
        *,
        key: str,
        now: datetime,
    ) -> tuple[SpendAuthorization, bool]:
        """Create an authorization, or return the one this key made; say whether it replayed.

        Raises:
            SimError: ``IDEMPOTENCY_KEY_REUSED`` for a key that made a different one.
        """
        fingerprint = hashlib.sha256(
            json.dumps(request.model_dump(mode="json"), sort_keys=True).encode()
        ).hexdigest()
        earlier = self._keys.get((account, key))
        if earlier is not None:
            if earlier[0] != fingerprint:
                raise SimError(
                    ErrorCode.IDEMPOTENCY_KEY_REUSED,
                    "this Idempotency-Key already created a different authorization",
                )
            return self._kept[earlier[1]].stated(now), True
        kept = _Kept(mint("sa"), account, principal, request, now)
        self._kept[kept.authorization_id] = kept
        self._keys[(account, key)] = (fingerprint, kept.authorization_id)
        return kept.stated(now), False

    def _get(self, account: str, authorization_id: str) -> _Kept:
        kept = self._kept.get(authorization_id)
        if kept is None or kept.account != account:
            raise SimError(
                ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND,
                "no such spend authorization for this account",
            )
        return kept

    def get(self, account: str, authorization_id: str, now: datetime) -> SpendAuthorization:
        """Return the account's authorization, or ``SPEND_AUTHORIZATION_NOT_FOUND``."""
        return self._get(account, authorization_id).stated(now)

    def list(self, account: str, now: datetime) -> list[SpendAuthorization]:
        """Return the account's authorizations, newest first."""
        kept = [k for k in self._kept.values() if k.account == account]
        return [k.stated(now) for k in reversed(kept)]

    def charge(
        self, account: str, authorization_id: str, quote: TrainingQuote, now: datetime
    ) -> SpendAuthorization:
        """Count a new run on ``quote`` against the authorization, if it covers the quote now.

        Raises:
            SimError: ``SPEND_AUTHORIZATION_NOT_FOUND``, or ``AUTHORIZATION_DOES_NOT_COVER``
                with the reason.
        """
        kept = self._get(account, authorization_id)
        reason = covers(kept.stated(now), quote, now)
        if reason is not None:
            raise SimError(
                ErrorCode.AUTHORIZATION_DOES_NOT_COVER,
                f"the standing authorization {authorization_id} does not cover quote "
                f"{quote.quote_id}: {reason}",
                field="authorization_id",
                details={"reason": reason},
            )
        kept.runs += 1
        kept.spend_usd += quote.budget_usd
        return kept.stated(now)

    def revoke(
        self, account: str, authorization_id: str, principal: str, now: datetime
    ) -> SpendAuthorization:
        """Revoke an authorization; revoking it again answers it as it is."""
        kept = self._get(account, authorization_id)
        if kept.revoked_at is None:
            kept.revoked_at, kept.revoked_by = now, principal
        return kept.stated(now)


def covers(authorization: SpendAuthorization, quote: TrainingQuote, now: datetime) -> str | None:
    """Return why ``authorization`` does not cover ``quote`` at ``now``, or None when it does.

    Every limit given must hold, for this run and in total counting this run, and whatever the
    limits a covered run must be estimated to end before the booking's term. The reason is a
    sentence for a person.
    """
    for check in (_standing, _plan, _per_run, _manifest, _data, _totals):
        reason = check(authorization, quote, now)
        if reason is not None:
            return reason
    return None


def _standing(authorization: SpendAuthorization, quote: TrainingQuote, now: datetime) -> str | None:
    if authorization.state is not SpendAuthorizationState.ACTIVE:
        return f"the authorization is {authorization.state.value}"
    if now >= authorization.expires_at:
        return f"the authorization expired at {authorization.expires_at.isoformat()}"
    if now >= quote.expires_at:
        return f"the quote expired at {quote.expires_at.isoformat()}"
    return None


def _plan(_: SpendAuthorization, quote: TrainingQuote, __: datetime) -> str | None:
    if quote.plan.parallelism.refused:
        return f"the backend refuses the plan: {quote.plan.parallelism.reason}"
    if not quote.ends_before_term:
        return (
            f"the run may take up to {quote.plan.duration_hours.high:,.0f} h and outlast the "
            f"booking's term, which ends {quote.term_end.isoformat()}: only a person may "
            "confirm that"
        )
    return None


def _per_run(authorization: SpendAuthorization, quote: TrainingQuote, _: datetime) -> str | None:
    limits = authorization.limits
    if limits.max_budget_usd is not None and quote.budget_usd > limits.max_budget_usd:
        return (
            f"the budget ${quote.budget_usd:,.2f} is above the authorization's "
            f"${limits.max_budget_usd:,.2f} per run"
        )
    high = quote.plan.cost_usd.high
    if limits.max_estimate_high_usd is not None and high > limits.max_estimate_high_usd:
        return (
            f"the estimate reaches ${high:,.2f}, above the authorization's "
            f"${limits.max_estimate_high_usd:,.2f} per run"
        )
    patterns = limits.booking_id_patterns
    if patterns is not None and not any(fnmatchcase(quote.booking_id, p) for p in patterns):
        return f"the booking {quote.booking_id} matches none of {', '.join(patterns)}"
    return None


def _manifest(authorization: SpendAuthorization, quote: TrainingQuote, _: datetime) -> str | None:
    limits, manifest = authorization.limits, quote.manifest
    if (limits.model_sizes is not None or limits.targets is not None) and manifest is None:
        return "the quote states no manifest to check the model size and target against"
    if manifest is None:
        return None
    if limits.model_sizes is not None and manifest.model_size not in limits.model_sizes:
        return f"the model size {manifest.model_size} is not among {', '.join(limits.model_sizes)}"
    if limits.targets is not None and manifest.target not in limits.targets:
        return f"the target {manifest.target!r} is not among the authorization's targets"
    return None


def _data(authorization: SpendAuthorization, quote: TrainingQuote, _: datetime) -> str | None:
    """Refuse data the authorization's person did not name: the data is what a run learns."""
    patterns = authorization.limits.data_ref_patterns
    if patterns is None:
        return "the authorization names no data (it was made before v0.5), so it covers no run"
    if quote.manifest is None:
        return "the quote states no manifest to check the data against"
    for data_ref in quote.manifest.data_refs:
        if not any(data_ref_matches(pattern, data_ref) for pattern in patterns):
            ambiguity = data_ref_ambiguity(data_ref)
            why = f" ({ambiguity}, which a store may resolve elsewhere)" if ambiguity else ""
            return (
                f"the data {data_ref!r} matches none of the authorization's data patterns "
                f"{', '.join(patterns)}{why}"
            )
    return None


def _totals(authorization: SpendAuthorization, quote: TrainingQuote, _: datetime) -> str | None:
    limits, used = authorization.limits, authorization.used
    if limits.max_runs is not None and used.runs + 1 > limits.max_runs:
        return f"the authorization's {limits.max_runs} runs are used"
    total = limits.total_spend_usd
    if total is not None and used.spend_usd + quote.budget_usd > total:
        return (
            f"the budget ${quote.budget_usd:,.2f} would take the authorization past its total "
            f"${total:,.2f} (${used.spend_usd:,.2f} used)"
        )
    return None
