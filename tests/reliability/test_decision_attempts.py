"""Decision attempts without a person's sign-in at the backend (contract v0.5): seeded, judged by
the simulator's own records.

A colleague's run waits for a decision on a loss-spike restart. An attacker holds what a stock
worker leaks to anyone with Prefect API access — the workload's token — or no token at all, and
tries every route a decision could take. A seeded generator builds each attempt:

- **the decision route with a workload's token** (``service:…``, the scopes a workload is
  minted): approve or reject, a typed name or none (a name of the colleague's person included), a
  reason, with or without an idempotency key (a fresh one, or the colleague's), on the pending
  action or a made-up one;
- **the decision route with another account's person**: the same bodies with a person's token
  of another account (a backend never shows one account's run to another);
- **the decide page without a person's sign-in**: the action's code posted with no sign-in, an
  account name and a wrong passphrase, the colleague's account name alone, a foreign ``Origin``
  or ``Referer``, no CSRF token, another account's person signed in, a session's CSRF token
  replayed from another browser;
- **through Prefect**: the flow never decides; a flow run paused on the restart, with the
  workload's token as its own, is sent a forged approval (Prefect's server refuses the shape)
  and a forged ``recheck`` (it reads the backend, which still waits).

The judge is the simulator: no decision may be recorded on the colleague's run, and it still
waits. Controls, not attacks: the colleague's person, signed in on the decide page, decides, and
the decision is recorded as theirs.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from typing import Any

import httpx
from flow_helpers import wait_for_pause
from page_browser import PageBrowser
from prefect import get_client
from prefect.flow_engine import run_flow_async
from pydantic import SecretStr
from reliability_kit import BOOKING, Backend, request_for, scenario_with, training_fields
from spend_helpers import covering_authorization
from trial_counts import count

from prefect_ito.backend.auth import store_token
from prefect_ito.contract import ALL_SCOPES, IDEMPOTENCY_HEADER
from prefect_ito.flows import ito_training
from prefect_ito.simulator import Scenario
from prefect_ito.simulator.scenario import SimPerson

CATEGORY = "decision-attempts"
RECORDED = "decisions recorded"
SEED = 20261205
API_ATTEMPTS = count(full=240, everyday=60)
PAGE_ATTEMPTS = count(full=80, everyday=24)
PAGE_WAYS = (
    "no sign-in",
    "wrong passphrase",
    "account name alone",
    "foreign Origin",
    "foreign Referer, no Origin",
    "no CSRF token",
    "another account's person",
    "CSRF token of another browser",
)


THROTTLE = 2.0
PEOPLE = ("reliability", "globex")
"""The people this test's scenario has: the colleague's account, and another account."""


def _with_people() -> Scenario:
    base = scenario_with("loss-spike")
    people = [SimPerson(account=a, secret=SecretStr(f"{a}-passphrase")) for a in PEOPLE]
    # A short throttle window, so that the control signs in once the attacks' window passed.
    return base.model_copy(update={"people": people, "page_attempt_window_seconds": THROTTLE})


def _spiked(target: Backend) -> dict[str, Any]:
    """Start the colleague's run (account ``reliability``) and return it once it waits."""
    person = _token(target, "reliability", "user:colleague")
    with httpx.Client(base_url=target.url, headers=_auth(person), timeout=30) as http:
        body = request_for(BOOKING).to_submission().model_dump(mode="json")
        quoted = http.post("/v0/training-quotes", json=body)
        assert quoted.status_code == 201, quoted.text
        quote = quoted.json()["data"]
        http.post(
            f"/v0/training-quotes/{quote['quote_id']}/confirmations",
            json={},
            headers={IDEMPOTENCY_HEADER: "colleague-confirms"},
        ).raise_for_status()
        made = http.post(
            "/v0/training-runs",
            json={**body, "quote_id": quote["quote_id"]},
            headers={IDEMPOTENCY_HEADER: "colleague-submits"},
        )
        run: dict[str, Any] = made.json()["data"]["run"]
        for _ in range(300):
            if run.get("pending_action"):
                return run
            run = http.get(
                f"/v0/training-runs/{run['run_id']}",
                params={"after_version": run["version"], "wait": 1},
            ).json()["data"]
    raise AssertionError("the colleague's run never waited for a decision")


def _token(target: Backend, account: str, principal: str, scopes: Any = None) -> str:
    if scopes is None and principal.startswith("user:"):
        scopes = [scope.value for scope in ALL_SCOPES]
    minted = target.sim.mint_token(account, scopes=scopes, principal=principal)
    return minted.get_secret_value()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _decisions(target: Backend) -> list[Any]:
    return [d for admin in target.sim.runs() for d in admin.run.decisions]


def test_decision_attempts_through_the_api_record_nothing(backend, ledger):
    target: Backend = backend(_with_people())
    run = _spiked(target)
    action = run["pending_action"]["action_id"]
    rng = random.Random(SEED)
    workload = _token(target, "reliability", "service:nightly")
    outsider = _token(target, "globex", "user:mallory")
    faults: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    with httpx.Client(base_url=target.url, timeout=30) as http:
        for _ in range(API_ATTEMPTS):
            who, token = rng.choice([("workload token", workload), ("other account", outsider)])
            body: dict[str, Any] = {
                "decision": rng.choice(["approve", "reject"]),
                "reason": rng.choice(["looks fine", "a blip", "x" * 200]),
            }
            if (name := rng.choice([None, "Ada", "user:colleague", "prefect-ito"])) is not None:
                body["decided_by"] = name
            key = rng.choice([None, f"attack-{uuid.uuid4()}", "colleague-submits"])
            target_action = rng.choice([action, action, "act_000000000000"])
            headers = {**_auth(token), **({IDEMPOTENCY_HEADER: key} if key else {})}
            answer = http.post(
                f"/v0/training-runs/{run['run_id']}/actions/{target_action}/decision",
                json=body,
                headers=headers,
            )
            faults[f"decision route: {who}"] += 1
            outcomes[f"answered {answer.status_code}"] += 1

    recorded = _decisions(target)
    ledger.record(
        CATEGORY,
        trials=API_ATTEMPTS,
        faults=dict(faults),
        outcomes={RECORDED: len(recorded), **outcomes},
        measures={"seed": str(SEED)},
    )
    assert recorded == []
    assert set(outcomes) <= {"answered 403", "answered 404", "answered 422"}, outcomes
    assert target.sim.runs()[0].run.pending_action is not None


def test_decision_attempts_on_the_decide_page_record_nothing(backend, ledger):
    target: Backend = backend(_with_people())
    run = _spiked(target)
    action = run["pending_action"]
    page = str(httpx.URL(action["decide_url"]).copy_with(query=None))
    rng = random.Random(SEED + 1)
    faults: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for _ in range(PAGE_ATTEMPTS):
        way = rng.choice(PAGE_WAYS)
        answer = _page_attempt(target, way, action, page, rng)
        faults[f"decide page: {way}"] += 1
        outcomes[f"answered {answer.status_code}"] += 1

    # The control: the colleague's person, signed in, decides; recorded as theirs.
    time.sleep(THROTTLE + 0.5)
    with PageBrowser(target.url) as browser:
        browser.sign_in_at(action["decide_url"], "reliability", "reliability-passphrase")
        decided = browser.post(
            page, {"user_code": action["user_code"], "decision": "reject", "reason": "seen it"}
        )
    recorded = _decisions(target)
    ledger.record(
        CATEGORY,
        trials=PAGE_ATTEMPTS,
        faults=dict(faults),
        outcomes={RECORDED: 0 if decided.status_code == 200 else len(recorded), **outcomes},
        measures={"control (the colleague's person, signed in)": f"{len(recorded)} recorded"},
    )
    assert set(outcomes) <= {"answered 400", "answered 401", "answered 403", "answered 429"}
    assert decided.status_code == 200, decided.text
    assert [(d.principal, d.decision.value) for d in recorded] == [("user:reliability", "reject")]


def _page_attempt(
    target: Backend, way: str, action: dict[str, Any], page: str, rng: random.Random
) -> httpx.Response:
    """Make one attempt on the decide page in ``way``; return the page's answer."""
    decision = {
        "user_code": action["user_code"],
        "decision": rng.choice(["approve", "reject"]),
        "reason": "looks fine",
    }
    with PageBrowser(target.url) as browser, PageBrowser(target.url) as other:
        browser.get(action["decide_url"])
        if way == "wrong passphrase":
            return browser.post(page, {"account": "reliability", "secret": "guess!!!", **decision})
        if way == "account name alone":
            return browser.post(page, {"account": "reliability", **decision})
        if way == "another account's person":
            signed_in = {"account": "globex", "secret": "globex-passphrase"}
            return browser.post(page, {**signed_in, **decision})
        if way == "foreign Origin":
            return browser.post(page, decision, {"Origin": "https://evil.test"})
        if way == "foreign Referer, no Origin":
            return browser.post(page, decision, {"Origin": "", "Referer": "https://evil.test/"})
        if way == "no CSRF token":
            browser.hidden = {}
            return browser.post(page, decision)
        if way == "CSRF token of another browser":
            other.get(action["decide_url"])
            browser.hidden = dict(other.hidden)
            return browser.post(page, decision)
        return browser.post(page, decision)  # no sign-in


async def test_a_forged_answer_in_prefect_decides_nothing(backend, prefect_server, ledger):
    """The flow never decides: forged answers to its restart question change nothing, even with
    a workload's token as the flow's own."""
    target: Backend = backend(_with_people())
    store_token(target.url, SecretStr(_token(target, "reliability", "service:nightly")))
    parameters = {
        "training": training_fields(approval_timeout=120),
        "credentials": target.credentials(),
        "authorization": covering_authorization(target.sim, "reliability"),
    }
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=parameters)
    running = asyncio.ensure_future(
        run_flow_async(ito_training, flow_run=flow_run, parameters=parameters, return_type="state")
    )
    outcomes: Counter[str] = Counter()
    try:
        await wait_for_pause(flow_run.id)
        async with get_client() as client:
            forged = {"decision": "approve", "decided_by": "Ada", "reason": "looks fine"}
            refused = await client.resume_flow_run(flow_run.id, run_input=forged)
            outcomes[f"forged approval: {refused.status.value.lower()}"] += 1
            recheck = {"decision": "recheck", "reason": "decided, honestly"}
            taken = await client.resume_flow_run(flow_run.id, run_input=recheck)
            outcomes[f"forged recheck: {taken.status.value.lower()}"] += 1
        # The flow reads the backend, which still waits, and asks again under a key of its own.
        async with asyncio.timeout(60):
            while True:
                again = await wait_for_pause(flow_run.id)
                if (again.state_details.pause_key or "").endswith("-again-2"):
                    outcomes["asked again"] += 1
                    break
                await asyncio.sleep(0.3)
    finally:
        running.cancel()
    recorded = _decisions(target)
    ledger.record(
        CATEGORY,
        trials=2,
        faults={"Prefect: forged approval": 1, "Prefect: forged recheck": 1},
        outcomes={RECORDED: len(recorded), **outcomes},
    )
    assert recorded == [] and outcomes["asked again"] == 1, outcomes
    assert target.sim.runs()[0].run.pending_action is not None
    posts = [r for r in target.requests() if r.path.endswith("/decision")]
    assert posts == []  # the flow sent no decision at all
