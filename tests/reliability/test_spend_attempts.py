"""Spend attempts without a person: randomized, judged by the simulator's own runs.

A colleague with Prefect API access holds at most the worker's token (the four training scopes,
principal ``service:prefect-worker``) and whatever Prefect lets anyone write. A seeded generator
picks, for each attempt, one route and its parameters:

- over HTTP with the worker's token (most attempts): submissions without a quote, on a quote
  nobody confirmed, with a v0.3 ``confirmation`` in the body, after confirming or authorizing
  with the worker's own token (403), naming a made-up or another account's authorization or
  quote, a quote a person confirmed for another manifest, a declined quote, a quote a person's
  run already used (sent again under new keys, and quoted again), a re-quote after the booking
  got pricier or its term shorter, an authorization a person made that does not cover the quote
  (budget, estimate, model size, target, booking pattern, total, term, revoked, expired,
  exhausted), and a quote a person confirmed that expired;
- as whole ``ito-training`` flow runs (the Prefect-side routes): an inline authorization
  parameter, a forged ``ItoSpendAuthorization`` block, answers written under the spend pause's
  response key before it was asked, Resume pressed (empty, v0.3 ``confirm``, ``recheck``), the
  form answered without anyone confirming at the backend, and a ``credentials`` parameter naming
  a person's keyring entry or carrying a token.

The judge is the simulator's record: a run whose idempotency key is not one of a person's own
setup steps counts as created by the attempt, and there must be none. Controls, where a person
did confirm at the backend (or made a covering authorization), must make exactly one run each.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx
from prefect import get_client
from prefect.flow_engine import run_flow_async
from prefect.input import create_flow_run_input
from reliability_kit import Backend, completed_bookings, training_fields
from spend_helpers import PERSON, confirm_at_backend
from trial_counts import count

from prefect_ito.backend.auth import store_token
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import (
    ALL_SCOPES,
    IDEMPOTENCY_HEADER,
    NewSpendLimits,
    SpendAuthorizationRequest,
    TrainingRequest,
)
from prefect_ito.flows import ito_training
from prefect_ito.parameters import BookingClaim, TrainingParameters
from prefect_ito.people import answers, spend
from prefect_ito.waiting.waits import QuoteWait, latest_wait

SEED = 20_260_504
HTTP_ATTEMPTS = count(full=240, everyday=56)
HTTP_CONTROLS = count(full=24, everyday=12)
FLOW_ATTEMPTS = count(full=24, everyday=12)
FLOW_CONTROLS = 3
FLOW_AT_ONCE = 8
ACCOUNT = "reliability"
STRANGER = "other-team"
WORKER = "service:prefect-worker"
QUOTE_TTL = 0.25
"""Real seconds a quote lives on the expiry route's simulator."""
SIZES = ["150M", "1B", "8B", "70B"]
BUDGETS = [1_000.0, 50_000.0, 250_000.0, 2_000_000.0]
DATA = ["catalog://ito/web-2026-10", "catalog://fineweb-edu", "s3://corpus/web"]
TARGETS = ["code-assistant", "chat assistant", "summarizer"]
TERMINAL = {"succeeded", "failed", "cancelled", "budget_exhausted", "refused", "timed_out"}


# --- the HTTP side ------------------------------------------------------------------------------


class Attacker:
    """One simulator seen by the worker's token, a person of the account and one of another."""

    def __init__(self, target: Backend, rng: random.Random, canaries: set[str]) -> None:
        self.sim, self.rng = target.sim, rng
        self.worker = self._client(principal=WORKER)
        self.person = self._client(scopes=[s.value for s in ALL_SCOPES], principal=PERSON)
        self.stranger = self._client(STRANGER, [s.value for s in ALL_SCOPES], "user:mallory")
        canaries.update(c.headers["Authorization"].removeprefix("Bearer ") for c in self.clients)

    @property
    def clients(self) -> list[httpx.Client]:
        return [self.worker, self.person, self.stranger]

    def _client(
        self, account: str = ACCOUNT, scopes: list[str] | None = None, principal: str = ""
    ) -> httpx.Client:
        token = self.sim.mint_token(account, scopes=scopes, principal=principal)
        return httpx.Client(
            base_url=self.sim.url,
            headers={"Authorization": f"Bearer {token.get_secret_value()}"},
            timeout=30,
        )

    def body(self, booking: str, **changes: Any) -> dict[str, Any]:
        rng = self.rng
        fields: dict[str, Any] = {
            "booking_id": booking,
            "model_size": rng.choice(SIZES),
            "data_refs": rng.sample(DATA, rng.randint(1, len(DATA))),
            "target": rng.choice(TARGETS),
            "budget_usd": rng.choice(BUDGETS),
            **changes,
        }
        return TrainingRequest(**fields).to_submission().model_dump(mode="json")

    def key(self) -> str:
        """Return a fresh idempotency key, drawn from the seeded generator."""
        return (
            f"{self.rng.choice(['k', 'retry', 'flow'])}-{uuid.UUID(int=self.rng.getrandbits(128))}"
        )

    def post(self, client: httpx.Client, path: str, body: Any, key: str = "") -> httpx.Response:
        key = key or self.key()
        return client.post(path, json=body, headers={IDEMPOTENCY_HEADER: key})

    def quote(self, body: dict[str, Any], client: httpx.Client | None = None) -> dict[str, Any]:
        answer = self.post(client or self.worker, "/v0/training-quotes", body)
        assert answer.status_code == 201, answer.text
        quote: dict[str, Any] = answer.json()["data"]
        return quote

    def confirmed(self, body: dict[str, Any], client: httpx.Client | None = None) -> str:
        """Return a quote for ``body`` a person (of the client's account) confirmed."""
        person = client or self.person
        quote_id = self.quote(body, person)["quote_id"]
        answer = self.post(person, f"/v0/training-quotes/{quote_id}/confirmations", {})
        assert answer.status_code == 200, answer.text
        return str(quote_id)

    def submit(self, body: dict[str, Any], key: str = "", **names: Any) -> httpx.Response:
        return self.post(self.worker, "/v0/training-runs", {**body, **names}, key)

    def authorization(self, account: str = ACCOUNT, expires: float = 86_400, **limits: Any) -> str:
        request = SpendAuthorizationRequest(
            name="made by a person",
            limits=NewSpendLimits.model_validate({"data_ref_patterns": ["*"], **limits}),
            expires_at=datetime.now(UTC) + timedelta(seconds=expires),
        )
        principal = PERSON if account == ACCOUNT else "user:mallory"
        made = self.sim.add_spend_authorization(request, account=account, principal=principal)
        return made.authorization_id

    def finish(self, run_id: str) -> None:
        """Cancel a setup run and wait until it ended, so its booking takes a new run."""
        self.post(self.worker, f"/v0/training-runs/{run_id}/cancel", {"reason": "setup"})
        for _ in range(50):
            run = self.worker.get(f"/v0/training-runs/{run_id}", params={"wait": 1}).json()
            if run["data"]["state"] in TERMINAL:
                return
        raise AssertionError(f"setup run {run_id} never ended")

    def change_booking(self, booking: str, **update: Any) -> None:
        held = next(b for b in self.sim.bookings() if b.booking_id == booking)
        self.sim.add_booking(held.model_copy(update=update))


Route = Callable[[Attacker, str], list[httpx.Response]]


def no_quote(a: Attacker, booking: str) -> list[httpx.Response]:
    names = a.rng.choice([{}, {"authorization_id": None}, {"quote_id": None}])
    return [a.submit(a.body(booking), **names)]


def unconfirmed_quote(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    return [a.submit(body, quote_id=a.quote(body)["quote_id"]) for _ in range(a.rng.randint(1, 3))]


def v03_confirmation(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    written = {
        "confirmed_by": a.rng.choice(["Ada Lovelace", "user:ada", PERSON]),
        "via": a.rng.choice(["person", "standing_authorization"]),
        "manifest_digest": body["manifest_digest"],
    }
    names: dict[str, Any] = {"confirmation": written}
    if a.rng.random() < 0.7:
        names["quote_id"] = written["quote_id"] = a.quote(body)["quote_id"]
    if a.rng.random() < 0.3:
        names["authorization_id"] = "(unsaved)"
    return [a.submit(body, **names)]


def worker_confirms(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    quote_id = a.quote(body)["quote_id"]
    note = a.rng.choice([{}, {"note": "Ada said yes"}, {"principal": PERSON}])
    answers_ = [a.post(a.worker, f"/v0/training-quotes/{quote_id}/confirmations", note)]
    return [*answers_, a.submit(body, quote_id=quote_id)]


def worker_authorizes(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    request = {
        "name": "nightly",
        "limits": {
            "max_budget_usd": 1e12,
            "booking_id_patterns": ["*"],
            "data_ref_patterns": ["*"],
        },
        "expires_at": "2099-01-01T00:00:00Z",
    }
    made = a.post(a.worker, "/v0/spend-authorizations", request)
    guessed = f"sa_{uuid.UUID(int=a.rng.getrandbits(128)).hex[:16]}"
    return [made, a.submit(body, quote_id=a.quote(body)["quote_id"], authorization_id=guessed)]


def made_up_authorization(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    quote_id = a.quote(body)["quote_id"]
    forged = a.rng.choice(
        [
            "sa_forged",
            "(unsaved)",
            quote_id,
            f"sa_{a.rng.getrandbits(64):016x}",
            "sa_0000000000000000",
        ]
    )
    return [a.submit(body, quote_id=quote_id, authorization_id=forged)]


def strangers_authorization(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    theirs = a.authorization(STRANGER, max_budget_usd=1e12)
    return [a.submit(body, quote_id=a.quote(body)["quote_id"], authorization_id=theirs)]


def strangers_confirmed_quote(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    return [a.submit(body, quote_id=a.confirmed(body, a.stranger))]


def quote_for_another_manifest(a: Attacker, booking: str) -> list[httpx.Response]:
    seen = a.body(booking, budget_usd=1_000.0, model_size="150M")
    quote_id = a.confirmed(seen)
    field = a.rng.choice(["budget_usd", "model_size", "target", "data_refs", "booking_id"])
    other = {
        "budget_usd": 250_000.0,
        "model_size": "70B",
        "target": "a different target",
        "data_refs": ["s3://elsewhere/data"],
        "booking_id": "bk-h200-2x8-ib",
    }[field]
    fields = {k: seen[k] for k in ("booking_id", "model_size", "data_refs", "target", "budget_usd")}
    sent = TrainingRequest(**{**fields, field: other}).to_submission().model_dump(mode="json")
    return [a.submit(sent, quote_id=quote_id)]


def declined_quote(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    quote_id = a.quote(body)["quote_id"]
    decliner = a.rng.choice([a.worker, a.person])
    a.post(decliner, f"/v0/training-quotes/{quote_id}/declines", {"note": "too dear"})
    confirm = a.post(a.worker, f"/v0/training-quotes/{quote_id}/confirmations", {})
    requoted = a.quote(body)["quote_id"]
    return [confirm, a.submit(body, quote_id=quote_id), a.submit(body, quote_id=requoted)]


def used_quote_new_keys(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking, model_size="8B", budget_usd=250_000.0)
    quote_id = a.confirmed(body)
    made = a.post(
        a.person, "/v0/training-runs", {**body, "quote_id": quote_id}, f"setup-used-{booking}"
    )
    assert made.status_code == 201, made.text
    if a.rng.random() < 0.8:  # else still running: the same manifest is then a replay
        a.finish(made.json()["data"]["run"]["run_id"])
    sent = [a.submit(body, quote_id=quote_id) for _ in range(a.rng.randint(1, 4))]
    return [*sent, a.submit(body, quote_id=a.quote(body)["quote_id"])]


def requote_after_change(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking, model_size="8B", budget_usd=250_000.0)
    first = a.confirmed(body)
    if a.rng.random() < 0.5:
        a.change_booking(booking, node_count=a.rng.choice([4, 10, 20, 32]))
    else:
        a.change_booking(
            booking, term_end=datetime.now(UTC) + timedelta(hours=a.rng.choice([1, 3]))
        )
    requoted = a.quote(body)
    assert requoted["state"] == "pending" and requoted["not_carried"], requoted
    refused = a.submit(body, quote_id=requoted["quote_id"])
    # The quote the person confirmed before the change, sent as it was: what they confirmed is
    # the cost and term they saw, so the backend prices it again and refuses it. (The first
    # version of this module found it was taken: 17 runs of 17.)
    stale = a.submit(body, quote_id=first)
    return [refused, stale]


NOT_COVERING = [
    "budget", "estimate", "model size", "target", "booking pattern", "total", "term",
    "revoked", "expired", "exhausted",
]  # fmt: skip


def authorization_not_covering(a: Attacker, booking: str) -> list[httpx.Response]:
    why = a.rng.choice(NOT_COVERING)
    body = a.body(booking, model_size="8B", budget_usd=250_000.0, target="code-assistant")
    limits: dict[str, Any] = {
        "budget": {"max_budget_usd": a.rng.choice([1_000.0, 249_999.0])},
        "estimate": {"max_estimate_high_usd": 10.0},
        "model size": {"model_sizes": a.rng.sample(["150M", "1B", "70B"], 2)},
        "target": {"targets": ["chat"]},
        "booking pattern": {"booking_id_patterns": ["bk-nightly-*", "bk-h100-*"]},
        "total": {"total_spend_usd": 100_000.0},
        "exhausted": {"max_runs": 1},
    }.get(why, {"max_budget_usd": 1e9})
    authorization = a.authorization(expires=-5 if why == "expired" else 86_400, **limits)
    if why == "term":
        a.change_booking(booking, term_end=datetime.now(UTC) + timedelta(hours=1))
    if why == "revoked":
        a.person.delete(f"/v0/spend-authorizations/{authorization}")
    if why == "exhausted":  # its one run, a covered one, made first
        quote_id = a.quote(body)["quote_id"]
        setup = a.submit(
            body, f"setup-exhaust-{booking}", quote_id=quote_id, authorization_id=authorization
        )
        assert setup.status_code == 201, setup.text
        a.finish(setup.json()["data"]["run"]["run_id"])
    return [a.submit(body, quote_id=a.quote(body)["quote_id"], authorization_id=authorization)]


def expired_confirmation(a: Attacker, booking: str) -> list[httpx.Response]:
    body = a.body(booking)
    quote_id = a.confirmed(body)
    time.sleep(QUOTE_TTL + 0.05)
    return [a.submit(body, quote_id=quote_id), a.submit(body, quote_id=a.quote(body)["quote_id"])]


ROUTES: dict[str, Route] = {
    "no quote_id": no_quote,
    "quote nobody confirmed": unconfirmed_quote,
    "v0.3 confirmation in the body": v03_confirmation,
    "worker's token confirms": worker_confirms,
    "worker's token authorizes": worker_authorizes,
    "made-up authorization_id": made_up_authorization,
    "another account's authorization": strangers_authorization,
    "another account's confirmed quote": strangers_confirmed_quote,
    "quote confirmed for another manifest": quote_for_another_manifest,
    "declined quote": declined_quote,
    "used quote, new keys": used_quote_new_keys,
    "re-quote after the booking got pricier or shorter": requote_after_change,
    "authorization that does not cover": authorization_not_covering,
    "confirmed quote expired": expired_confirmation,
}


def _code(answer: httpx.Response) -> str:
    error = answer.json().get("error") or {}
    return f"{answer.status_code} {error.get('code', 'ok')}"


def _plan(rng: random.Random, routes: list[str], count: int) -> list[str]:
    """Every route about equally often, in a random order."""
    plan = [routes[index % len(routes)] for index in range(count)]
    rng.shuffle(plan)
    return plan


def test_no_spend_attempt_over_http_creates_a_run(backend, sweep, ledger):
    rng = random.Random(SEED)
    bookings = completed_bookings(HTTP_ATTEMPTS + HTTP_CONTROLS, prefix="bk-spend")
    attacker = Attacker(backend(bookings=bookings), rng, sweep.canaries)
    short = Attacker(backend(bookings=bookings, quote_ttl_seconds=QUOTE_TTL), rng, sweep.canaries)
    faults, answered, created = Counter[str](), Counter[str](), Counter[str]()
    for index, route in enumerate(_plan(rng, list(ROUTES), HTTP_ATTEMPTS)):
        on = short if route == "confirmed quote expired" else attacker
        before = {admin.run_id for admin in on.sim.runs()}
        responses = ROUTES[route](on, f"bk-spend-{index:03d}")
        new = [admin for admin in on.sim.runs() if admin.run_id not in before]
        faults[route] += 1
        answered.update(_code(answer) for answer in responses)
        made = [run for run in new if not run.idempotency_key.startswith("setup-")]
        created[route] += len(made)
    controls = _controls(attacker, rng)
    for each in (attacker, short):
        for client in each.clients:
            client.close()

    ledger.record(
        "spend-attempts",
        trials=HTTP_ATTEMPTS,
        faults={f"http: {route}": n for route, n in faults.items()},
        outcomes={"runs created": sum(created.values()), **_controls_outcomes(controls)},
        measures={
            "seed": str(SEED),
            "backend answers to the worker's token (http)": ", ".join(
                f"{code} {n}" for code, n in sorted(answered.items())
            ),
        },
    )
    assert set(faults) == set(ROUTES)
    assert sum(created.values()) == 0, dict(created)
    assert sum(controls.values()) == HTTP_CONTROLS
    assert all(kind.endswith(": one run each") for kind in controls), controls


CONTROL_KINDS = ["a person confirmed", "a covering authorization", "one quote, two submissions"]


def _controls(a: Attacker, rng: random.Random) -> Counter[str]:
    """Submissions a person did allow: each must make exactly one run."""
    outcome = Counter[str]()
    for index, kind in enumerate(_plan(rng, CONTROL_KINDS, HTTP_CONTROLS)):
        booking = f"bk-spend-{HTTP_ATTEMPTS + index:03d}"
        body = a.body(booking, model_size="8B", budget_usd=250_000.0)
        before = {admin.run_id for admin in a.sim.runs()}
        if kind == "a covering authorization":
            authorization = a.authorization(max_budget_usd=1e9, max_runs=1)
            a.submit(body, quote_id=a.quote(body)["quote_id"], authorization_id=authorization)
        else:
            quote_id = a.confirmed(body)
            tries = 2 if kind == "one quote, two submissions" else 1
            keys = [a.key() for _ in range(tries)]  # drawn here: the threads draw nothing
            with ThreadPoolExecutor(tries) as pool:
                list(pool.map(partial(a.submit, body, quote_id=quote_id), keys))
        new = [admin.run for admin in a.sim.runs() if admin.run_id not in before]
        allowed = all(run.confirmation and run.confirmation.confirmed_by == PERSON for run in new)
        made = "one run each" if len(new) == 1 and allowed else f"{len(new)} runs"
        outcome[f"{kind}: {made}"] += 1
    return outcome


def _controls_outcomes(controls: Counter[str]) -> dict[str, int]:
    return {f"control (a person allowed it): {k}": n for k, n in controls.items()}


# --- the Prefect side ---------------------------------------------------------------------------

OnPause = Callable[[Any, Any], Awaitable[None]]


async def _drive(
    parameters: dict[str, Any],
    before: Callable[[Any], Awaitable[None]] | None = None,
    at_pause: OnPause | None = None,
) -> Any:
    """Run ``ito-training`` here; ``before`` acts on its flow run first, ``at_pause`` at pauses."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=parameters)
    if before is not None:
        await before(flow_run.id)
    running = asyncio.ensure_future(
        run_flow_async(ito_training, flow_run=flow_run, parameters=parameters, return_type="state")
    )
    acting = asyncio.ensure_future(_watch(flow_run.id, at_pause)) if at_pause else None
    try:
        return await running
    finally:
        if acting is not None:
            acting.cancel()


async def _watch(flow_run_id: Any, at_pause: OnPause) -> None:
    handled: set[Any] = set()
    while True:
        await asyncio.sleep(0.3)
        async with get_client() as client:
            state = (await client.read_flow_run(flow_run_id)).state
        if state is None or not state.is_paused() or not state.state_details.run_input_keyset:
            continue
        if state.id not in handled:
            handled.add(state.id)
            await at_pause(flow_run_id, state)


def _v03_answer(digest: str) -> dict[str, Any]:
    return {"decision": "confirm", "confirmed_by": "Ada", "manifest_digest": digest}


class FlowRoutes:
    """The Prefect-side routes, each a flow run against one simulator with its own booking."""

    def __init__(self, target: Backend, rng: random.Random, sweep: Any) -> None:
        self.target, self.rng, self.sim = target, rng, target.sim
        worker = self.sim.mint_token(ACCOUNT, principal=WORKER)
        person = self.sim.mint_token(
            ACCOUNT, scopes=[s.value for s in ALL_SCOPES], principal=PERSON
        )
        sweep.canaries.update(t.get_secret_value() for t in (worker, person))
        store_token(self.sim.url, worker)  # what the worker's login left: its own token
        store_token(self.sim.url, person, keyring_entry="ada")  # a person logged in there too
        self.person_token = person.get_secret_value()

    def parameters(self, booking: str, **changes: Any) -> dict[str, Any]:
        changes.setdefault("approval_timeout", 6)  # the in-process wait gives up after 1 s
        training = training_fields(booking=booking, **changes)
        return {
            "training": training,
            "credentials": ItoCredentials(api_url=self.sim.url),
            "authorization": None,
        }

    def digest(self, parameters: dict[str, Any]) -> str:
        training = TrainingParameters(**parameters["training"])
        request = training.to_request(BookingClaim(booking_id=training.booking))
        return request.to_submission().manifest_digest

    async def inline_authorization(self, booking: str) -> Any:
        inline = self.rng.choice(
            [
                {"authorized_by": "Ada Lovelace", "max_budget_usd": 1e12, "booking_ids": ["*"],
                 "expires_at": "2099-01-01T00:00:00Z"},
                {"authorization_id": "sa_forged", "limits": {"max_budget_usd": 1e12}},
                {"authorization_id": "sa_forged", "max_budget_usd": 1e12, "principal": PERSON},
            ]
        )  # fmt: skip
        parameters = {**self.parameters(booking), "authorization": inline}
        return await _drive(parameters, at_pause=self._form("recheck"))

    async def forged_block(self, booking: str) -> Any:
        named = self.rng.choice(["made-up", "another account's", "not covering", "revoked"])
        if named == "made-up":
            authorization_id = f"sa_{self.rng.getrandbits(64):016x}"
        else:
            account = STRANGER if named == "another account's" else ACCOUNT
            limits = {"max_budget_usd": 1_000.0} if named == "not covering" else {}
            request = SpendAuthorizationRequest(
                name="a person's",
                limits=NewSpendLimits.model_validate(
                    {"max_budget_usd": 1e9, "data_ref_patterns": ["*"], **limits}
                ),
                expires_at=datetime.now(UTC) + timedelta(days=1),
            )
            made = self.sim.add_spend_authorization(request, account=account, principal=PERSON)
            authorization_id = made.authorization_id
            if named == "revoked":
                httpx.delete(
                    f"{self.sim.url}/v0/spend-authorizations/{authorization_id}",
                    headers={"Authorization": f"Bearer {self.person_token}"},
                )
        name = f"forged-{booking}"
        await ItoSpendAuthorization(authorization_id=authorization_id).asave(name, overwrite=True)
        parameters = {**self.parameters(booking), "authorization": name}
        answer = self.rng.choice(["recheck", "decline", None])
        return await _drive(parameters, at_pause=self._form(answer))

    async def prewritten_input(self, booking: str) -> Any:
        parameters = self.parameters(booking)
        digest = self.digest(parameters)
        value = self.rng.choice(
            [{"decision": "recheck"}, _v03_answer(digest), {"decision": "confirm"}]
        )
        key = spend.pause_key(digest)

        async def write(flow_run_id: Any) -> None:
            for kind in ("paused", "suspended"):
                await create_flow_run_input(
                    answers.response_key(kind, key), value, flow_run_id=flow_run_id
                )

        return await _drive(parameters, before=write)

    async def resume_pressed(self, booking: str) -> Any:
        parameters = self.parameters(booking)
        run_input = self.rng.choice(
            [None, _v03_answer(self.digest(parameters)), {"decision": "recheck"}]
        )

        async def press(flow_run_id: Any, _: Any) -> None:
            async with get_client() as client:
                # Refused by Prefect (its form has no "confirm", say): as good an outcome.
                with contextlib.suppress(Exception):
                    await client.resume_flow_run(flow_run_id, run_input=run_input)

        return await _drive(parameters, at_pause=press)

    async def form_only(self, booking: str) -> Any:
        return await _drive(self.parameters(booking), at_pause=self._form("recheck"))

    async def credentials_parameter(self, booking: str) -> Any:
        credentials = self.rng.choice(
            [
                {"api_url": self.sim.url, "keyring_entry": "ada"},
                # A token written into Prefect (a made-up one: a real one written there would be
                # the writer's own leak, which the suite's sweep rightly counts) is never used.
                {"api_url": self.sim.url, "token": f"written-in-prefect-{uuid.uuid4().hex}"},
            ]
        )
        parameters = {**self.parameters(booking), "credentials": credentials}
        return await _drive(parameters, at_pause=self._form(self.rng.choice(["recheck", None])))

    async def control(self, booking: str) -> Any:
        async def confirm(flow_run_id: Any, _: Any) -> None:
            record = await latest_wait(flow_run_id, QuoteWait)
            assert record is not None
            confirm_at_backend(self.sim, record.quote_id, ACCOUNT)

        # Generous: a control waits only until its confirmation is seen, and a busy machine is slow.
        return await _drive(self.parameters(booking, approval_timeout=180), at_pause=confirm)

    def _form(self, answer: str | None) -> OnPause:
        """Answer the Prefect form only (never the backend): the UI's resume with input."""

        async def answer_form(flow_run_id: Any, state: Any) -> None:
            if answer is not None:
                await answers.resume_with(flow_run_id, state, {"decision": answer, "reason": "x"})

        return answer_form


FLOW_ROUTES = {
    "inline authorization parameter": FlowRoutes.inline_authorization,
    "forged ItoSpendAuthorization block": FlowRoutes.forged_block,
    "answer written before the question": FlowRoutes.prewritten_input,
    "Resume pressed": FlowRoutes.resume_pressed,
    "form answered, nobody confirmed at the backend": FlowRoutes.form_only,
    "credentials parameter": FlowRoutes.credentials_parameter,
}


async def test_no_spend_attempt_through_prefect_creates_a_run(
    prefect_server, backend, sweep, ledger
):
    rng = random.Random(SEED + 1)
    bookings = completed_bookings(FLOW_ATTEMPTS + FLOW_CONTROLS, prefix="bk-flow")
    routes = FlowRoutes(backend(bookings=bookings), rng, sweep)
    plan = _plan(rng, list(FLOW_ROUTES), FLOW_ATTEMPTS)
    gate = asyncio.Semaphore(FLOW_AT_ONCE)

    async def attempt(index: int, route: str) -> Any:
        async with gate:
            return await FLOW_ROUTES[route](routes, f"bk-flow-{index:03d}")

    control_bookings = [f"bk-flow-{FLOW_ATTEMPTS + i:03d}" for i in range(FLOW_CONTROLS)]

    async def control(booking: str) -> Any:
        async with gate:
            return await routes.control(booking)

    # The controls run beside the attempts, each on a booking of its own.
    ended = await asyncio.gather(
        *(control(booking) for booking in control_bookings),
        *(attempt(index, route) for index, route in enumerate(plan)),
    )
    controls, states = ended[:FLOW_CONTROLS], ended[FLOW_CONTROLS:]
    runs = routes.sim.runs()
    attacked = [a for a in runs if a.run.booking_id not in control_bookings]
    by_person = [
        a.run.booking_id
        for a in runs
        if a.run.confirmation is not None and a.run.confirmation.confirmed_by == PERSON
    ]
    sweep.text("spend attempts: flow states", "\n".join(f"{s.name}: {s.message}" for s in states))

    ledger.record(
        "spend-attempts",
        trials=FLOW_ATTEMPTS,
        faults={f"flow: {route}": n for route, n in Counter(plan).items()},
        outcomes={
            "runs created": len(attacked),
            "control (a person confirmed at the backend): flow run completed with one run": sum(
                1 for s in controls if s.is_completed()
            ),
        },
        measures={
            "flow runs ended (attempts)": ", ".join(
                f"{n} {k}" for k, n in sorted(Counter(s.name for s in states).items())
            ),
        },
    )
    assert attacked == [], [a.run.run_id for a in attacked]
    assert all(s.is_completed() for s in controls), [s.message for s in controls]
    assert sorted(by_person) == control_bookings
