"""End to end in a browser: a person approves a loss-spike restart on the backend's decide page,
confirms a spend on the backend's confirm page, and declines one in the Prefect UI.

Headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright) opens the UI that
``prefect server start`` serves, presses Resume on the run suspended at a loss spike, checks the
evidence, the chart, the decide link and code, and that the form
(:class:`~prefect_ito.people.approval.RestartCheck`) can only recheck; a forged approval and a
forged ``Cancelled`` event change nothing; it signs in on the decide page as the person and
approves there; then it looks at the flow run's Artifacts tab, the telemetry card and the
decisions card. Beside that run, another one parks for
the watcher: each run's page says in its state message which one waits for a person. For a
spend (contract v0.4) it signs in with the person's passphrase on the simulator's confirm page
(the quote's ``confirm_url``) and confirms there, and it declines another in the Resume form,
which opens on the cost and can only decline or recheck. Screenshots of each are kept in
``test-output/browser/`` (or ``$PREFECT_ITO_TEST_OUTPUT/browser/``); those in ``docs/img/`` are
copies of some, looked at by a person. SQLite only: the UI is the
same for every database. Without Chromium or Playwright the test is skipped, unless
``PREFECT_ITO_REQUIRE_BROWSER=1`` (set by ``.ci/run``) turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import httpx
import pytest
from e2e_stack import (
    ACCOUNT,
    BROWSER_BOOKING,
    BROWSER_CONFIRM_BOOKING,
    BROWSER_DECLINE_BOOKING,
    CHECKOUT,
    PASSPHRASE,
    STALLED_BOOKING,
    WORKLOAD,
    Stack,
    backend_runs,
    completed,
    flow_run_processes,
    named,
    on_booking,
    start_training,
    suspend_on_spike,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events import emit_event
from prefect.states import Cancelled

from prefect_ito.contract import DecisionChoice, QuoteState, RunState, TrainingQuote
from prefect_ito.reporting.quote_card import estimate
from prefect_ito.reporting.report import artifact_key
from prefect_ito.waiting.keys import DEFER_PREFIX, RESTART_PREFIX, SPEND_PREFIX
from prefect_ito.waiting.waits import QuoteWait, latest_wait

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_BROWSER = "PREFECT_ITO_REQUIRE_BROWSER"
TEST_OUTPUT = "PREFECT_ITO_TEST_OUTPUT"
HOW_TO_RUN_BROWSER = (
    "Browser approval skipped: install Debian's chromium (apt-get install chromium, which "
    "provides /usr/bin/chromium) and the dev dependencies (uv sync, for playwright), or run "
    ".ci/run, which does both"
)
UI_TIMEOUT_MS = 60_000
"""Generous: the UI is a Vue app that loads, then polls the API, on a busy 2-core machine."""

WITHOUT_WEBGL = ["--disable-gpu", "--disable-software-rasterizer"]
"""No WebGL: the flow run page's graph is drawn with it, which Chromium without a GPU emulates on
the CPU, redrawing while the page is open: 140 of the two tests' 220 CPU seconds on this machine,
28 without. These tests read forms, states and cards, never the graph (its box stays empty)."""
CARD = ".p-layout-well__content"
"""An artifact's page: its description and its content."""
APPROVER = "Grace Hopper"
REASON = "the spike follows a bad data shard; restart from the checkpoint"
CONFIRMER = f"user:{ACCOUNT}"
"""Who the confirm page signs in: the person of the worker's account."""
NOTE = "Ada, from the confirm page"
DECLINE_REASON = "not this month: the data is not ready"
FORGERY_SETTLES = 10.0
"""Seconds any Automation, deployment and worker get to act on a forged answer or event."""
RESUME_WITHIN = 45.0
"""A bound on a hang, not a speed figure: seconds from a person's confirmation to the watcher's
resume of the suspended flow run. The watcher's change feed resumes it within seconds (the test
prints the figure); a busy machine took 6.9 s where 5 were asked."""


def missing_browser() -> str | None:
    """Say what this machine lacks to drive Chromium, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} does not exist"
    return None


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Return Debian's Chromium, or skip (fail when required) before any server work starts."""
    missing = missing_browser()
    if missing is not None:
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(f"{REQUIRE_BROWSER}=1 but {missing}")
        pytest.skip(f"{HOW_TO_RUN_BROWSER} ({missing})")
    return CHROMIUM


@pytest.fixture
async def page(chromium: Path) -> AsyncIterator[Page]:
    """Yield a page of a fresh headless Chromium, which is closed afterwards."""
    from playwright.async_api import async_playwright, expect

    # Playwright never downloads a browser here: it drives the system's Chromium.
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium, headless=True, args=WITHOUT_WEBGL
        )
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            expect.set_options(timeout=UI_TIMEOUT_MS)
            yield page
        finally:
            await browser.close()


@asynccontextmanager
async def screenshot_on_failure(page: Page, path: Path) -> AsyncIterator[None]:
    """Save what the browser showed when the block fails, and say where."""
    try:
        yield
    except Exception as exc:
        await page.screenshot(path=path, full_page=True)
        exc.add_note(f"screenshot of the page: {path}")
        raise


def form_field(dialog: Locator, title: str) -> Locator:
    """Return the generated form's field whose label starts with the schema title ``title``."""
    # The UI may append "(Optional)" to the title. ``has`` is matched inside each field, so it
    # starts from the page, not from the dialog.
    label_text = dialog.page.get_by_text(re.compile(rf"^{re.escape(title)}\b"))
    return dialog.locator(".schema-form-property").filter(has=label_text)


def screenshot_dir() -> Path:
    """Return where the screenshots go: kept after the run, for people and CI to look at.

    ``test-output/browser/`` in the checkout (ignored by git), or ``$PREFECT_ITO_TEST_OUTPUT``.
    """
    root = Path(os.environ.get(TEST_OUTPUT) or CHECKOUT / "test-output")
    directory = root / "browser"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def sign_in_to_prefect(page: Page, ui_url: str) -> None:
    """Sign in to the Prefect UI of a server behind its API auth string, as a person would."""
    await page.goto(f"{ui_url}/login")
    await page.locator("input").first.fill(os.environ["PREFECT_API_AUTH_STRING"])
    await page.keyboard.press("Enter")
    await page.wait_for_url(lambda url: not url.endswith("/login"))


async def open_resume_form(page: Page, flow_run_url: str) -> Locator:
    """Open a paused flow run's page, press Resume, and return the form's dialog."""
    await page.goto(flow_run_url)
    await page.get_by_role("button", name="Resume", exact=True).click()
    return page.get_by_role("dialog").filter(has_text="Resume Flow Run")


async def show_state_message(page: Page, flow_run_url: str, starting: str) -> None:
    """Open a flow run's Details tab, where Prefect's UI shows the state's message."""
    from playwright.async_api import expect

    await page.goto(flow_run_url)
    await page.locator(".p-tab", has_text="Details").click()
    details = page.locator(".flow-run-details")
    await expect(details).to_contain_text(starting)
    await details.get_by_text("See More").click()  # the whole message, not its first line
    await expect(page.get_by_text("Deployment", exact=True)).to_be_visible()  # loaded


async def choose(page: Page, field: Locator, option: str, among: list[str] | None = None) -> None:
    """Pick ``option`` in one of the generated form's drop-downs, from the keyboard.

    With ``among``, first check that the drop-down offers exactly those options, in that order.
    """
    from playwright.async_api import expect

    await field.locator(".p-select-button__control").focus()
    await page.keyboard.press("ArrowDown")
    # Opened soon after the window was resized (as snapshot() does), the list sometimes opens
    # with the page behind the form scrolled, below the window, and Prefect's virtual scroller
    # renders no option until the list is in view: a person scrolls to it, and so does this.
    await page.locator(".p-select-options").scroll_into_view_if_needed()
    if among is not None:
        await expect(page.locator(".p-select-option")).to_have_text(among)
    await page.locator(".p-select-option", has_text=re.compile(rf"^{option}$")).click()
    await expect(field.locator(".p-select-button__value")).to_have_text(option)


async def snapshot(page: Page, part: Locator, path: Path) -> None:
    """Save a screenshot of ``part`` as a person sees it once it settled.

    The page grows tall first, so that a scrolling box (the form's evidence) shows all of itself;
    transitions are skipped, so that nothing is caught half faded in.
    """
    size = page.viewport_size or {"width": 1400, "height": 1000}
    await page.set_viewport_size({"width": size["width"], "height": 1800})
    try:
        await part.screenshot(path=path, animations="disabled")
    finally:
        await page.set_viewport_size(size)


async def seen_without_scrolling(part: Locator) -> bool:
    """Tell whether ``part`` shows whole in its scrolling box, scrolled to the top, as opened."""
    return bool(
        await part.evaluate(
            """element => {
                const box = element.getBoundingClientRect();
                for (let up = element.parentElement; up; up = up.parentElement) {
                    if (/(auto|scroll)/.test(getComputedStyle(up).overflowY)) {
                        const frame = up.getBoundingClientRect();
                        return up.scrollTop === 0 && box.top >= frame.top
                            && box.bottom <= frame.bottom;
                    }
                }
                return box.bottom <= window.innerHeight;
            }"""
        )
    )


async def rendered_images(scope: Locator) -> list[int]:
    """Return the natural width of every SVG data-URI image in ``scope`` the browser decoded."""
    images = scope.locator('img[src^="data:image/svg+xml;base64,"]')
    return [
        await images.nth(i).evaluate("img => img.complete ? img.naturalWidth : 0")
        for i in range(await images.count())
    ]


@pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
async def test_a_person_approves_a_restart_on_the_backend_s_decide_page(
    chromium: Path, stack: Stack, page: Page
):
    """A deployment's run suspends at a loss spike, holding no process; the Resume form shows the
    evidence, the decide link and its code, and can only recheck; forged answers in Prefect and a
    forged ``Cancelled`` event change nothing; a person approves on the backend's decide page,
    signed in as themselves; the watcher resumes the run within seconds; the record is theirs.

    ``chromium`` comes first so that a machine without a browser skips before the stack starts.
    Screenshots of the form, the decide page, the Artifacts tab, the telemetry card and the
    decisions card are kept in :func:`screenshot_dir`.
    """
    from playwright.async_api import expect

    # Its backend run stalls, so the watcher leaves it parked (stall_timeout is an hour).
    parked = await start_training(on_booking(STALLED_BOOKING, defer_after=1))
    suspended = await suspend_on_spike(BROWSER_BOOKING)
    ui_url = stack.api_url.removesuffix("/api")
    await sign_in_to_prefect(page, ui_url)
    shots = screenshot_dir()
    (waiting,) = backend_runs(stack, BROWSER_BOOKING)
    action = waiting.pending_action
    assert action is not None and action.decide_url and action.user_code

    # A colleague with Prefect API access forges an approval, and a Cancelled event; what they
    # would have done is looked for once the pages below were read.
    async with get_client() as client:
        forged = {"decision": "approve", "decided_by": "Eve", "reason": "looks fine"}
        refused = await client.resume_flow_run(suspended.id, run_input=forged)
    assert refused.status.value == "REJECT", refused.details
    emit_event(
        event="prefect.flow-run.Cancelled",
        resource={"prefect.resource.id": f"prefect.flow-run.{suspended.id}"},
    )
    forged_at = asyncio.get_running_loop().time()

    async with screenshot_on_failure(page, shots / "failure.png"):
        await wait_for_flow_run(parked.id, parked_for_the_watcher)
        parked_says = "Parked: waiting for the backend (run "
        await show_state_message(page, f"{ui_url}/runs/flow-run/{parked.id}", parked_says)
        await expect(page.get_by_text("its backend run changes; nothing to do.")).to_be_visible()
        await page.screenshot(path=shots / "parked-run.png", animations="disabled")
        asking = "Waiting for a person: approve or reject a restart from ckpt-pretrain-"
        await show_state_message(page, f"{ui_url}/runs/flow-run/{suspended.id}", asking)
        await page.screenshot(path=shots / "restart-wait-run.png", animations="disabled")
        await stop_parked(parked.id)

        dialog = await open_resume_form(page, f"{ui_url}/runs/flow-run/{suspended.id}")
        # The spike's evidence is rendered above the form, so the person knows what it is about.
        await expect(dialog).to_contain_text("Loss spike in")
        await expect(dialog).to_contain_text(BROWSER_BOOKING)
        await expect(dialog.locator("th")).to_have_text(["evidence", "value"])
        await expect(dialog).to_contain_text("spent so far")
        assert await rendered_images(dialog) == [440]  # the chart, drawn at the dialog's width
        # Where to decide: the backend's page, its address and code (for a text-only terminal).
        link = dialog.get_by_role("link", name="the decide page")
        await expect(link).to_have_attribute("href", action.decide_url)
        await expect(dialog).to_contain_text(action.decide_url)
        await expect(dialog).to_contain_text(f"code {action.user_code}")
        # The form decides nothing: its one choice is to read the backend again, none preset.
        decision = form_field(dialog, "Decision")
        await expect(decision.locator(".p-select-button__value")).to_have_text("")
        await snapshot(page, page.locator(".p-modal__card"), shots / "approval-form.png")
        await choose(page, decision, "recheck", among=["recheck"])
        await page.keyboard.press("Escape")

        # Any Automation, deployment and worker had time to act on the forgeries by now.
        await asyncio.sleep(forged_at + FORGERY_SETTLES - asyncio.get_running_loop().time())
        (still,) = backend_runs(stack, BROWSER_BOOKING)
        assert still.pending_action is not None and still.decisions == []
        assert still.state is RunState.AWAITING_DECISION
        assert (await read_state_name(suspended.id)) == "Suspended"

        # The person, on the backend's page: signed in as themselves, reading who asked.
        await page.goto(action.decide_url)
        await expect(page.get_by_label("Decision code")).to_have_value(action.user_code)
        await page.get_by_label("Account").fill(ACCOUNT)
        await page.get_by_label("Passphrase").fill(PASSPHRASE)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_text(f"Restart proposed for run {still.run_id}.")).to_be_visible()
        await expect(page.locator("tr", has_text="Asked by")).to_contain_text(WORKLOAD)
        await expect(page.locator("tr", has_text="For flow run")).to_contain_text(str(suspended.id))
        await page.get_by_label("Why").fill(REASON)
        await page.get_by_label("Note").fill(APPROVER)
        await snapshot(page, page.locator("body"), shots / "decide-page.png")
        clicked = datetime.now(UTC)
        await page.get_by_role("button", name="Approve the restart").click()
        await expect(page.get_by_text(f"Approved as {CONFIRMER}")).to_be_visible()
        took = await resumed_within(suspended.id, clicked, asking_for_restart)
        await wait_for_flow_run(suspended.id, completed)

        (run,) = backend_runs(stack, BROWSER_BOOKING)
        keys = sorted(
            artifact_key(run.run_id, kind)
            for kind in ("decisions", "gates", "progress", "telemetry")
        )
        # One card per concern, on the flow run (the task runs hold none).
        await page.goto(f"{ui_url}/runs/flow-run/{suspended.id}")
        await page.locator(".p-tab", has_text="Artifacts").click()
        cards = page.locator(".artifact-card")
        await expect(cards).to_have_count(4)
        assert sorted(await cards.locator(".artifact-card__title").all_inner_texts()) == keys
        await expect(page.locator(".flow-run-artifacts__none")).to_have_text("None")
        await snapshot(page, page.locator(".flow-run-artifacts"), shots / "artifacts-tab.png")

        await cards.filter(has_text=artifact_key(run.run_id, "telemetry")).click()
        await expect(page.get_by_text("Telemetry — run")).to_be_visible()
        assert await rendered_images(page.locator("body")) == [720]  # the loss chart
        await snapshot(page, page.locator(CARD), shots / "telemetry-card.png")

        await page.go_back()
        await page.locator(".p-tab", has_text="Artifacts").click()
        await cards.filter(has_text=artifact_key(run.run_id, "decisions")).click()
        await expect(page.get_by_text("1 restart proposed: 1 approved.").first).to_be_visible()
        for words in (f"Approved by {CONFIRMER}", REASON, "ckpt-pretrain-"):
            await expect(page.get_by_text(words).first).to_be_visible()
        await snapshot(page, page.locator(CARD), shots / "decisions-card.png")

    assert took < RESUME_WITHIN, took
    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, d.principal, d.decided_by, d.reason) for d in run.decisions] == [
        (DecisionChoice.APPROVE, CONFIRMER, APPROVER, REASON)
    ]
    assert stack.watcher_log is not None  # the watcher resumed it: the run held no process
    resumed = f"Resumed flow run {suspended.id}: backend run {run.run_id} no longer waits for"
    assert resumed in stack.watcher_log.read_text()


async def read_state_name(flow_run_id: UUID) -> str | None:
    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).state_name


def asking_for_restart(flow_run: FlowRun) -> bool:
    state = flow_run.state
    key = (state.state_details.pause_key or "") if state else ""
    return bool(state and state.is_paused() and key.startswith(RESTART_PREFIX))


@pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
async def test_a_person_confirms_a_spend_at_the_backend_and_declines_one_in_the_prefect_ui(
    chromium: Path, stack: Stack, page: Page
):
    """Two deployment runs nobody authorized suspend for their spend, holding no process.

    One is confirmed on the backend's confirm page, where a person signs in and reads the cost
    first; the watcher resumes it within seconds, and the backend records the person. The other
    is declined in the Prefect UI's Resume form, which shows the cost, the confirm link and the
    code, and cannot confirm: the flow run ends Declined, and so does the quote at the backend.
    """
    from playwright.async_api import expect

    # Both at once: their waits for the worker and a flow process overlap.
    confirming = await start_training(unauthorized(BROWSER_CONFIRM_BOOKING))
    declining = await start_training(unauthorized(BROWSER_DECLINE_BOOKING))
    ui_url = stack.api_url.removesuffix("/api")
    await sign_in_to_prefect(page, ui_url)
    shots = screenshot_dir()

    async with screenshot_on_failure(page, shots / "spend-failure.png"):
        quote = await suspended_for_spend(stack, confirming.id)
        assert quote.confirm_url and quote.user_code
        await page.goto(quote.confirm_url)
        await expect(page.get_by_label("Quote code")).to_have_value(quote.user_code)
        # The person signs in with their passphrase (never the account alone): user:<account>.
        await page.get_by_label("Account").fill(ACCOUNT)
        await page.get_by_label("Passphrase").fill(PASSPHRASE)
        await snapshot(page, page.locator("body"), shots / "confirm-page-sign-in.png")
        await page.get_by_role("button", name="Sign in").click()
        rows = page.locator("tr")
        await expect(rows.first).to_have_text(f"Estimated cost{cost(quote)}")  # cost first
        await expect(rows.nth(1)).to_have_text(f"Budget ceiling${quote.budget_usd:,.2f}")
        await expect(page.get_by_text(f"Quote {quote.quote_id}, state pending.")).to_be_visible()
        await expect(page.locator("input[name=user_code]")).to_have_value(quote.user_code)
        await page.get_by_label("Note").fill(NOTE)
        await snapshot(page, page.locator("body"), shots / "confirm-page.png")
        clicked = datetime.now(UTC)
        await page.get_by_role("button", name="Confirm", exact=True).click()
        await expect(page.get_by_text(f"Confirmed as {CONFIRMER}")).to_be_visible()
        await snapshot(page, page.locator("body"), shots / "confirm-page-confirmed.png")
        assert await resumed_within(confirming.id, clicked) < RESUME_WITHIN

        quote_b = await suspended_for_spend(stack, declining.id)
        dialog = await open_resume_form(page, f"{ui_url}/runs/flow-run/{declining.id}")
        # Cost first: the estimate, the ceiling and the term show as the form opens.
        ceiling = f"${quote_b.budget_usd:,.0f} at most"
        opening = dialog.get_by_role("heading", name=re.compile("^Spend on booking"))
        await expect(opening).to_have_text(
            f"Spend on booking {BROWSER_DECLINE_BOOKING}: {estimate(quote_b)} estimated, {ceiling}"
        )
        term = dialog.get_by_text("The booking's term ends")
        assert await seen_without_scrolling(opening) and await seen_without_scrolling(term)
        await page.screenshot(path=shots / "spend-form-as-opened.png", animations="disabled")
        link = dialog.get_by_role("link", name=re.compile("confirm page"))
        assert quote_b.confirm_url and quote_b.user_code
        await expect(link).to_have_attribute("href", quote_b.confirm_url)
        await expect(dialog).to_contain_text(quote_b.confirm_url)  # for a text-only terminal
        await expect(dialog).to_contain_text(f"code {quote_b.user_code}")
        decision = form_field(dialog, "Decision")
        await expect(decision.locator(".p-select-button__value")).to_have_text("")
        await form_field(dialog, "Reason").get_by_role("textbox").fill(DECLINE_REASON)
        await snapshot(page, page.locator(".p-modal__card"), shots / "spend-form.png")
        # The form offers no way to confirm.
        await choose(page, decision, "decline", among=["decline", "recheck"])
        await submit_as_a_person_would(page, dialog)
        declined = await wait_for_flow_run(declining.id, named("Declined"))
        await wait_for_flow_run(confirming.id, completed)

    (run,) = backend_runs(stack, BROWSER_CONFIRM_BOOKING)
    assert run.confirmation is not None
    assert (run.confirmation.confirmed_by, run.confirmation.via) == (CONFIRMER, "person")
    assert (run.confirmation.quote_id, run.confirmation.note) == (quote.quote_id, NOTE)
    assert run.confirmation.submitted_by == WORKLOAD  # the worker's token only submitted it
    assert run.manifest_digest == quote.manifest_digest
    assert stack.watcher_log is not None  # the watcher resumed it: the run held no process
    resumed = f"Resumed flow run {confirming.id}: quote {quote.quote_id} is confirmed."
    assert resumed in stack.watcher_log.read_text()
    assert declined.state is not None and declined.state.is_failed()
    assert backend_runs(stack, BROWSER_DECLINE_BOOKING) == []
    now = await read_quote(stack, quote_b.quote_id)
    assert now.state is QuoteState.DECLINED
    assert now.confirmation is not None  # declined by the flow, with the worker's token
    assert (now.confirmation.principal, now.confirmation.note) == (WORKLOAD, DECLINE_REASON)


def parked_for_the_watcher(flow_run: FlowRun) -> bool:
    state = flow_run.state
    key = (state.state_details.pause_key or "") if state else ""
    return bool(state and state.is_paused() and key.startswith(DEFER_PREFIX))


async def stop_parked(flow_run_id: UUID) -> None:
    """Cancel a parked flow run, so that no later module's watcher finds it waiting."""
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelled(), force=True)


def unauthorized(booking_id: str) -> dict[str, object]:
    """Return a deployment run's parameters on ``booking_id`` that name no authorization."""
    return {**on_booking(booking_id), "authorization": None}


def cost(quote: TrainingQuote) -> str:
    """Return the estimate as the confirm page writes it."""
    return f"${quote.plan.cost_usd.low:,.2f} – ${quote.plan.cost_usd.high:,.2f}"


async def suspended_for_spend(stack: Stack, flow_run_id: UUID) -> TrainingQuote:
    """Wait until the flow run suspends for a spend, with no process; return its quote."""
    suspended = await wait_for_flow_run(flow_run_id, asking_for_spend)
    assert suspended.state_name == "Suspended"
    await wait_for(lambda: not flow_run_processes(flow_run_id))  # it holds no process
    record = await latest_wait(flow_run_id, QuoteWait)
    assert record is not None and record.api_url == stack.simulator.url
    return await read_quote(stack, record.quote_id)


def asking_for_spend(flow_run: FlowRun) -> bool:
    state = flow_run.state
    key = (state.state_details.pause_key or "") if state else ""
    return bool(state and state.is_paused() and key.startswith(SPEND_PREFIX))


async def read_quote(stack: Stack, quote_id: str) -> TrainingQuote:
    """Read a quote as the backend states it, with the worker's token (training:read)."""
    async with httpx.AsyncClient(base_url=stack.simulator.url, timeout=10) as client:
        response = await client.get(
            f"/v0/training-quotes/{quote_id}",
            headers={"Authorization": f"Bearer {stack.token.get_secret_value()}"},
        )
    response.raise_for_status()
    return TrainingQuote.model_validate(response.json()["data"])


async def resumed_within(
    flow_run_id: UUID, since: datetime, waiting: Callable[[FlowRun], bool] | None = None
) -> float:
    """Wait until the flow run leaves its suspension for a person (``waiting``: its spend's by
    default); return seconds from ``since``.

    Measured by the server's timestamp of the first state after the suspension, so the figure
    does not depend on how often this test looks.
    """
    asking = waiting or asking_for_spend
    await wait_for_flow_run(flow_run_id, lambda run: not asking(run), timeout=60)
    async with get_client() as client:
        states = sorted(await client.read_flow_run_states(flow_run_id), key=lambda s: s.timestamp)
    after = [s for s in states if s.timestamp >= since and not s.is_paused()]
    seconds = (after[0].timestamp - since).total_seconds()
    print(f"resumed {seconds:.2f} s after the person's answer ({after[0].name})")
    return seconds


async def submit_as_a_person_would(page: Page, dialog: Locator) -> None:
    """Submit the form; the modal closes only once the server has accepted the input.

    Prefect's SQLite server now and then answers a write with "database is locked" on a busy
    machine, and the UI says "Something went wrong": a person submits again, and so does this.
    """
    from playwright.async_api import expect

    for attempt in range(3):
        await dialog.get_by_role("button", name="Submit").click()
        try:
            await expect(dialog).to_be_hidden(timeout=60_000)
            return
        except AssertionError:
            failed = page.get_by_text("Something went wrong")
            if attempt == 2 or not await failed.count():
                raise
            await failed.first.wait_for(state="visible")
