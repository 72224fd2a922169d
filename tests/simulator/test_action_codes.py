"""The decide page's codes: one per action among every run's, kept once the action is decided,
and a decision refused to any token that is not a person's, whatever it holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from prefect_ito.contract import ErrorCode, Scope
from prefect_ito.simulator.action_codes import ActionCodes, Proposal
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.identity import TokenInfo
from prefect_ito.simulator.state import decider


def test_a_code_drawn_before_is_drawn_again():
    drawn = iter(["BCDF-GHJK", "BCDF-GHJK", "LMNP-QRST"])
    codes = ActionCodes(draw=lambda: next(drawn))

    first = codes.issue("run_a", "act_a", "http://127.0.0.1:8/")
    second = codes.issue("run_b", "act_b", "http://127.0.0.1:8/")

    assert first == ("BCDF-GHJK", "http://127.0.0.1:8/decide?user_code=BCDF-GHJK")
    assert second == ("LMNP-QRST", "http://127.0.0.1:8/decide?user_code=LMNP-QRST")
    assert codes.find("BCDF-GHJK") == Proposal("run_a", "act_a")


def test_a_code_is_found_as_a_person_types_it_and_only_if_given():
    codes = ActionCodes(draw=lambda: "BCDF-GHJK")
    codes.issue("run_a", "act_a", None)

    assert codes.find("  bcdf-ghjk ") == Proposal("run_a", "act_a")
    assert codes.find("BCDF-GHJL") is None


def test_without_a_base_url_an_action_names_no_page():
    assert ActionCodes(draw=lambda: "BCDF-GHJK").issue("run_a", "act_a", None) == (
        "BCDF-GHJK",
        None,
    )


def _token(principal: str) -> TokenInfo:
    return TokenInfo(
        account="sim-user",
        issued=0.0,
        expires_at=datetime.max.replace(tzinfo=UTC),
        principal=principal,
        scopes=(Scope.DECIDE.value,),
    )


def test_a_workload_holding_the_decide_scope_still_does_not_decide():
    # Minting refuses it; a token that holds it anyway (a bug elsewhere) decides nothing.
    with pytest.raises(SimError) as refused:
        decider(_token("service:nightly"))

    assert refused.value.code is ErrorCode.INSUFFICIENT_SCOPE
    assert "only a person's token decides" in refused.value.message


def test_a_person_holding_the_decide_scope_decides():
    assert decider(_token("user:ada")).principal == "user:ada"
