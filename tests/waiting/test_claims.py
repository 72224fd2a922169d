"""When a claim another watcher holds goes stale: by the claim's own time, not when it was seen."""

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from prefect.client.schemas.objects import FlowRunInput

from prefect_ito.waiting.claims import CLAIM_STALE_SECONDS, held_until


def claim(age: float) -> FlowRunInput:
    created = datetime.now(UTC) - timedelta(seconds=age)
    return FlowRunInput(flow_run_id=uuid4(), key="ito-resume-x-1", value="", created=created)


def test_a_fresh_claim_is_held_until_its_own_time_plus_the_stale_limit():
    held = held_until([claim(CLAIM_STALE_SECONDS + 60), claim(10.0)])

    expected = datetime.now(UTC).timestamp() - 10.0 + CLAIM_STALE_SECONDS
    assert abs(held - expected) < 1.0


def test_a_race_lost_over_no_claim_or_a_stale_one_is_held_from_now():
    # The winner stored its claim a moment ago; the claims read before it are none or stale.
    for claims in ([], [claim(CLAIM_STALE_SECONDS + 60)]):
        expected = datetime.now(UTC).timestamp() + CLAIM_STALE_SECONDS
        assert abs(held_until(claims) - expected) < 1.0
