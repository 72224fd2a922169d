"""Once-only claims on a flow run: a flow-run input under a numbered key.

Prefect stores one input per key and refuses a second, so when several watchers (or one whose
view is a moment old) would take the same action on the same state of a flow run, each first
stores the next key under a prefix naming that state; only the one whose write went through acts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRunInput
from prefect.exceptions import PrefectHTTPStatusError

__all__ = ["CLAIM_STALE_SECONDS", "claim_turn", "held_until", "read_claims"]

CLAIM_STALE_SECONDS = 300.0
"""Longer than a claim's holder can take to act, Prefect's own retries included."""


async def read_claims(client: PrefectClient, flow_run_id: UUID, prefix: str) -> list[FlowRunInput]:
    """Return the flow run's claims (inputs) whose keys start with ``prefix``."""
    return await client.filter_flow_run_input(
        flow_run_id, key_prefix=prefix, limit=100, exclude_keys=set()
    )


async def claim_turn(
    client: PrefectClient, flow_run_id: UUID, prefix: str, claims: list[FlowRunInput], value: str
) -> bool:
    """Claim the one action on one state of a flow run (its inputs keyed ``prefix`` + a number).

    ``claims`` are the inputs already under ``prefix``. Tell whether this call holds the claim:
    none is held, or the newest is stale (its holder died before acting, see
    :data:`CLAIM_STALE_SECONDS`), and this call stored the next one.
    """
    if claims and not _stale(claims):
        return False
    return await _claim(client, flow_run_id, f"{prefix}{len(claims) + 1}", value)


async def _claim(client: PrefectClient, flow_run_id: UUID, key: str, value: str) -> bool:
    """Store the input ``key`` on the flow run; tell whether this call stored it (not another)."""
    try:
        await client.create_flow_run_input(flow_run_id, key, value)
    except PrefectHTTPStatusError as error:
        if error.response.status_code != 409:
            raise
        return False
    return True


def held_until(claims: list[FlowRunInput]) -> float:
    """Return when (seconds since the epoch) the claim that kept :func:`claim_turn` from
    claiming goes stale: the newest of ``claims`` if it is fresh, else one stored just now by
    another caller that won the race to the next key."""
    newest = _newest(claims)
    if newest is None or _stale(claims):
        newest = datetime.now(UTC)
    return (newest + timedelta(seconds=CLAIM_STALE_SECONDS)).timestamp()


def _stale(claims: list[FlowRunInput]) -> bool:
    """Tell whether the newest of these claims is older than :data:`CLAIM_STALE_SECONDS`."""
    newest = _newest(claims)
    cutoff = datetime.now(UTC) - timedelta(seconds=CLAIM_STALE_SECONDS)
    return newest is not None and newest < cutoff


def _newest(claims: list[FlowRunInput]) -> datetime | None:
    return max((claim.created for claim in claims if claim.created), default=None)
