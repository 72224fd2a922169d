"""The decide page a pending action's ``decide_url`` names (contract v0.5), and the decision
route: only a person, signed in or with a token of their own, decides, and the backend records
who. Driven as a browser would: form posts."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from page_browser import PageBrowser, passphrase

from prefect_ito.contract import IDEMPOTENCY_HEADER, WORKLOAD_SCOPES

HOSTILE = '<script>alert("x")</script>&'


@pytest.fixture
def spiked(desk_for: Any) -> tuple[Any, dict[str, Any]]:
    """A simulator whose run (of sim-user's account) waits for a restart decision."""
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["pending_action"] is not None)
    return desk, run


def _action(run: dict[str, Any]) -> dict[str, Any]:
    action: dict[str, Any] = run["pending_action"]
    return action


def _page_url(run: dict[str, Any]) -> str:
    return str(httpx.URL(_action(run)["decide_url"]).copy_with(query=None))


def _sign_in(browser: PageBrowser, run: dict[str, Any], account: str = "sim-user") -> Any:
    action = _action(run)
    return browser.sign_in_at(
        action["decide_url"], account, passphrase(account), user_code=action["user_code"]
    )


def _decide(
    browser: PageBrowser,
    run: dict[str, Any],
    decision: str,
    reason: str = "looked at the curve",
    headers: dict[str, str] | None = None,
    **more: str,
) -> httpx.Response:
    action = _action(run)
    code = action["user_code"]
    return browser.answer(action["decide_url"], code, decision, headers, reason=reason, **more)


def _decision_path(run: dict[str, Any]) -> str:
    return f"/v0/training-runs/{run['run_id']}/actions/{_action(run)['action_id']}/decision"


def _decide_as_grace(
    desk: Any, run: dict[str, Any], decision: str, reason: str, *, key: str
) -> httpx.Response:
    """Decide the run's pending action over the API with a person's own token (user:grace's),
    and no typed name."""
    with desk.person(principal="user:grace") as person:
        response: httpx.Response = person.post(
            _decision_path(run),
            json={"decision": decision, "reason": reason},
            headers={IDEMPOTENCY_HEADER: key},
        )
    return response


def _decisions(desk: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    decisions: list[dict[str, Any]] = desk.run(run["run_id"])["decisions"]
    return decisions


def test_a_pending_action_names_its_decide_page_and_code(spiked):
    desk, run = spiked
    action = _action(run)

    assert action["decide_url"] == f"{desk.sim.url}/decide?user_code={action['user_code']}"
    assert len(action["user_code"]) == 9  # XXXX-XXXX, as a quote's


def test_a_signed_in_person_sees_the_evidence_and_who_asked_then_decides_as_themselves(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, run)
        decided = _decide(browser, run, "approve", note="Ada Lovelace")

    assert page.status_code == 200, page.text
    for shown in (run["run_id"], "Loss spike", "Restart from", "Holding the run costs"):
        assert shown in page.text
    assert "Asked by" in page.text and "For flow run" in page.text
    assert 'value="approve"' in page.text and 'value="reject"' in page.text
    assert decided.status_code == 200, decided.text
    assert "Approved as user:sim-user" in decided.text
    (record,) = _decisions(desk, run)
    assert (record["principal"], record["decided_by"], record["decision"]) == (
        "user:sim-user",
        "Ada Lovelace",
        "approve",
    )
    done = desk.finished(desk.run(run["run_id"]))  # the run goes on, from the checkpoint
    assert done["state"] == "succeeded"
    steps = [p["step"] for p in done["telemetry"]["loss_history"]]
    assert _action(run)["proposed_checkpoint"]["step"] in steps[steps.index(_action(run)["step"]) :]


def test_a_rejection_on_the_page_is_the_person_s_and_the_run_goes_on(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        decided = _decide(browser, run, "reject", reason="the spike is a bad shard")

    assert decided.status_code == 200, decided.text
    assert "Rejected as user:sim-user" in decided.text
    (record,) = _decisions(desk, run)
    assert (record["principal"], record["decision"], record["reason"]) == (
        "user:sim-user",
        "reject",
        "the spike is a bad shard",
    )
    assert record.get("decided_by") is None  # no note given: nothing in its place
    assert desk.finished(desk.run(run["run_id"]))["state"] == "succeeded"


def test_a_decision_needs_a_reason_and_a_signed_in_person(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        browser.get(_action(run)["decide_url"])
        anonymous = _decide(browser, run, "approve")
        _sign_in(browser, run)
        blank = _decide(browser, run, "approve", reason="   ")

    assert anonymous.status_code == 401, anonymous.text
    assert blank.status_code == 200 and "Give a reason" in blank.text
    assert _decisions(desk, run) == []


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "https://evil.test"}, {"Origin": "", "Referer": "https://evil.test/x"}],
    ids=["foreign-origin", "foreign-referer"],
)
def test_a_post_from_another_site_decides_nothing(spiked, headers):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        forged = _decide(browser, run, "approve", headers=headers)

    assert forged.status_code == 403
    assert _decisions(desk, run) == []


def test_a_post_without_the_session_s_csrf_token_decides_nothing(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        browser.hidden = {}
        forged = _decide(browser, run, "approve")

    assert forged.status_code == 403
    assert _decisions(desk, run) == []


def test_the_page_is_never_framed_or_cached(spiked):
    _, run = spiked

    page = httpx.get(_action(run)["decide_url"])

    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"


def test_another_account_s_person_cannot_see_or_decide_the_action(spiked):
    # ada is a person of another account than sim-user's run.
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, run, account="ada")
        answer = _decide(browser, run, "approve")

    for response in (page, answer):
        assert response.status_code == 400
        assert run["run_id"] not in response.text
    assert _decisions(desk, run) == []


def test_wrong_codes_are_throttled(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        wrong = [
            browser.post(_page_url(run), {"user_code": f"BCDF-GHJ{c}"}).status_code
            for c in "KLMNPQ"
        ]
        right = _decide(browser, run, "approve")

    assert wrong[:5] == [400] * 5 and wrong[5] == 429
    assert right.status_code == 429 and "Retry-After" in right.headers
    assert _decisions(desk, run) == []


def test_what_a_person_typed_is_shown_never_run(spiked):
    desk, run = spiked

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        decided = _decide(browser, run, "reject", reason=HOSTILE, note=HOSTILE)
        browser.get(_action(run)["decide_url"])
        shown_again = _decide(browser, run, "reject")  # the page quotes the recorded reason

    assert decided.status_code == 200
    assert "<script>" not in decided.text
    (record,) = _decisions(desk, run)
    assert (record["reason"], record["decided_by"]) == (HOSTILE, HOSTILE)
    assert shown_again.status_code == 409
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in shown_again.text
    assert "<script>" not in shown_again.text


def test_who_asked_is_shown_escaped(desk_for):
    # The submitter's principal and the flow run's reference are whatever someone typed.
    desk = desk_for("loss-spike")
    asker, reference = 'user:<b>"mallory"</b>&', "<i>flow-run</i>&"
    body = desk.confirmed({**desk.body(), "client_reference": reference})
    with desk.person(principal=asker) as person:
        submitted = person.post("/v0/training-runs", json=body, headers={IDEMPOTENCY_HEADER: "k"})
    assert submitted.status_code == 201, submitted.text
    run = desk.wait_for(submitted.json()["data"]["run"], lambda r: r["pending_action"] is not None)

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, run)

    assert page.status_code == 200, page.text
    assert "<td>user:&lt;b&gt;&quot;mallory&quot;&lt;/b&gt;&amp;</td>" in page.text
    assert "<td>&lt;i&gt;flow-run&lt;/i&gt;&amp;</td>" in page.text
    assert "<b>" not in page.text and "<i>" not in page.text


def test_an_action_decided_already_says_so_and_is_not_decided_again(spiked):
    desk, run = spiked
    first = _decide_as_grace(desk, run, "reject", "seen it", key="decide-1")
    assert first.status_code == 200, first.text

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, run)
        again = _decide(browser, run, "approve")

    assert again.status_code == 409, again.text
    assert "already rejected by user:grace" in again.text and "seen it" in again.text
    assert 'value="approve"' not in again.text  # nothing left to answer
    (record,) = _decisions(desk, run)
    assert (record["principal"], record["decision"]) == ("user:grace", "reject")


def test_a_decided_action_s_code_is_no_wrong_guess(spiked):
    # The code names something of the account's: looking at it again is not guessing.
    desk, run = spiked
    assert desk.decide(run, "approve").status_code == 200

    with PageBrowser(desk.sim.url) as browser:
        looks = [_sign_in(browser, run).status_code]
        looks += [_decide(browser, run, "reject").status_code for _ in range(6)]

    assert looks == [409] * 7
    (record,) = _decisions(desk, run)
    assert record["decision"] == "approve"


def test_a_cancelled_run_s_action_says_it_no_longer_waits(spiked):
    desk, run = spiked
    cancel = desk.http.post(f"/v0/training-runs/{run['run_id']}/cancel", json={"reason": "done"})
    assert cancel.status_code == 200, cancel.text

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, run)
        answer = _decide(browser, run, "approve")

    for response in (page, answer):
        assert response.status_code == 409
        assert f"no longer pending: run {run['run_id']} is cancelled" in response.text
    assert _decisions(desk, run) == []


def test_each_action_has_its_own_code_and_a_decided_one_stays_decided(desk_for):
    desk = desk_for("two-spikes")
    first = desk.wait_for(desk.start(), lambda r: r["pending_action"] is not None)
    after = desk.decide(first, "reject").json()["data"]
    second = desk.wait_for(after, lambda r: r["pending_action"] is not None)

    assert _action(second)["user_code"] != _action(first)["user_code"]
    with PageBrowser(desk.sim.url) as browser:
        stale = _sign_in(browser, first)
        decided = _decide(browser, second, "approve")

    assert stale.status_code == 409 and "already rejected" in stale.text
    assert decided.status_code == 200, decided.text
    records = _decisions(desk, second)
    assert [(r["action_id"], r["decision"]) for r in records] == [
        (_action(first)["action_id"], "reject"),
        (_action(second)["action_id"], "approve"),
    ]


def test_a_workload_token_never_decides_and_is_never_minted_the_scope(spiked):
    desk, run = spiked
    workload = desk.sim.mint_token("sim-user", principal="service:nightly").get_secret_value()

    answer = httpx.post(
        desk.sim.url + _decision_path(run),
        json={"decision": "approve", "decided_by": "Ada", "reason": "looks fine"},
        headers={"Authorization": f"Bearer {workload}", IDEMPOTENCY_HEADER: "w-1"},
    )
    minted = desk.http.post(
        "/_sim/tokens",
        json={"account": "sim-user", "principal": "service:x", "scopes": ["training:decide"]},
    )
    who = httpx.get(
        desk.sim.url + "/v0/auth/whoami", headers={"Authorization": f"Bearer {workload}"}
    ).json()["data"]

    assert answer.status_code == 403 and answer.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
    assert minted.status_code == 422, minted.text
    error = minted.json()["error"]
    assert (error["code"], error["field"]) == ("VALIDATION_ERROR", "scopes")
    assert "training:decide" in error["message"]
    assert who["scopes"] == [scope.value for scope in WORKLOAD_SCOPES]
    assert _decisions(desk, run) == []


def test_a_person_s_token_decides_without_a_typed_name_and_is_on_record(spiked):
    desk, run = spiked

    answer = _decide_as_grace(desk, run, "approve", "the shard is fixed", key="decide-2")

    assert answer.status_code == 200, answer.text
    (record,) = _decisions(desk, run)
    assert (record["principal"], record.get("decided_by")) == ("user:grace", None)
