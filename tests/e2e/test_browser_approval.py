"""End to end in a browser: a person approves a loss-spike restart, and confirms a spend, in the
Prefect UI.

Headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright) opens the UI that
``prefect server start`` serves, presses Resume on the suspended run, checks the evidence and the
chart, fills the form Prefect generates from the :class:`~prefect_ito.approval.RestartDecision`
schema, is refused without a choice, approves and submits; then it looks at the flow run's
Artifacts tab, the telemetry card and the decisions card. Screenshots of each are kept in
``test-output/browser/`` (or ``$PREFECT_ITO_TEST_OUTPUT/browser/``). SQLite only: the UI is the
same for every database. Without Chromium or Playwright the test is skipped, unless
``PREFECT_ITO_REQUIRE_BROWSER=1`` (set by ``.ci/run``) turns the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from e2e_stack import (
    BROWSER_BOOKING,
    BROWSER_CONFIRM_BOOKING,
    CHECKOUT,
    NIGHTLY,
    Stack,
    backend_runs,
    completed,
    named,
    on_booking,
    suspend_on_spike,
    wait_for_flow_run,
)
from prefect.deployments import run_deployment

from prefect_ito.contract import DecisionChoice, RunState
from prefect_ito.reporting import artifact_key

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

CARD = ".p-layout-well__content"
"""An artifact's page: its description and its content."""
APPROVER = "Grace Hopper"
REASON = "the spike follows a bad data shard; restart from the checkpoint"


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
        browser = await playwright.chromium.launch(executable_path=chromium, headless=True)
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


async def open_resume_form(page: Page, flow_run_url: str) -> Locator:
    """Open a paused flow run's page, press Resume, and return the form's dialog."""
    await page.goto(flow_run_url)
    await page.get_by_role("button", name="Resume", exact=True).click()
    return page.get_by_role("dialog").filter(has_text="Resume Flow Run")


async def choose(page: Page, field: Locator, option: str) -> None:
    """Pick ``option`` in one of the generated form's drop-downs, from the keyboard."""
    from playwright.async_api import expect

    await field.locator(".p-select-button__control").focus()
    await page.keyboard.press("ArrowDown")
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


async def rendered_images(scope: Locator) -> list[int]:
    """Return the natural width of every SVG data-URI image in ``scope`` the browser decoded."""
    images = scope.locator('img[src^="data:image/svg+xml;base64,"]')
    return [
        await images.nth(i).evaluate("img => img.complete ? img.naturalWidth : 0")
        for i in range(await images.count())
    ]


@pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
async def test_a_person_approves_in_the_prefect_ui(chromium: Path, stack: Stack, page: Page):
    """Decide in the Resume form, then find the run's story on its Artifacts tab.

    ``chromium`` comes first so that a machine without a browser skips before the stack starts.
    Screenshots of the form, the Artifacts tab, the telemetry card and the decisions card are
    kept in :func:`screenshot_dir`.
    """
    from playwright.async_api import expect

    suspended = await suspend_on_spike(BROWSER_BOOKING)
    ui_url = stack.api_url.removesuffix("/api")
    shots = screenshot_dir()

    async with screenshot_on_failure(page, shots / "failure.png"):
        dialog = await open_resume_form(page, f"{ui_url}/runs/flow-run/{suspended.id}")
        # The spike's evidence is rendered above the form, so the person knows what they decide.
        await expect(dialog).to_contain_text("Loss spike in")
        await expect(dialog).to_contain_text(BROWSER_BOOKING)
        await expect(dialog.locator("th")).to_have_text(["evidence", "value"])
        await expect(dialog).to_contain_text("spent so far")
        assert await rendered_images(dialog) == [440]  # the chart, drawn at the dialog's width
        # Approve or reject is a required choice, and nothing is chosen to begin with.
        decision = form_field(dialog, "Decision")
        await expect(decision.locator(".p-select-button__value")).to_have_text("")
        await form_field(dialog, "Decided By").get_by_role("textbox").fill(APPROVER)
        await form_field(dialog, "Reason").get_by_role("textbox").fill(REASON)
        await snapshot(page, page.locator(".p-modal__card"), shots / "approval-form.png")

        # Submitting without a choice is refused, and the form stays open.
        await dialog.get_by_role("button", name="Submit").click()
        await expect(decision).to_contain_text("'decision' is a required property")
        await expect(dialog).to_be_visible()
        await choose(page, decision, "approve")
        await submit_as_a_person_would(page, dialog)
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
        for words in (f"Approved by {APPROVER}", REASON, "ckpt-pretrain-"):
            await expect(page.get_by_text(words).first).to_be_visible()
        await snapshot(page, page.locator(CARD), shots / "decisions-card.png")

    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, d.decided_by, d.reason) for d in run.decisions] == [
        (DecisionChoice.APPROVE, APPROVER, REASON)
    ]


@pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
async def test_a_person_confirms_a_spend_in_the_prefect_ui(
    chromium: Path, stack: Stack, page: Page
):
    """Confirm a run no standing authorization covers, in the Resume form of its flow run.

    The form shows what is confirmed (manifest, digest, plan, estimate, budget, booking term),
    refuses an untouched submission, and the backend records the person who confirmed.
    """
    from playwright.async_api import expect

    params = {**on_booking(BROWSER_CONFIRM_BOOKING), "authorization": None}
    flow_run = await run_deployment(NIGHTLY, parameters=params, timeout=0)
    suspended = await wait_for_flow_run(flow_run.id, named("Suspended"))
    assert suspended.state is not None
    assert (suspended.state.state_details.pause_key or "").startswith("spend-")
    ui_url = stack.api_url.removesuffix("/api")
    shots = screenshot_dir()

    async with screenshot_on_failure(page, shots / "spend-failure.png"):
        dialog = await open_resume_form(page, f"{ui_url}/runs/flow-run/{flow_run.id}")
        for shown in (BROWSER_CONFIRM_BOOKING, "sha256:", "budget", "GPU hours", "term ends"):
            await expect(dialog).to_contain_text(shown)
        digest = form_field(dialog, "Manifest Digest").get_by_role("textbox")
        assert (await digest.input_value()).startswith("sha256:")  # pre-filled from the quote
        decision = form_field(dialog, "Decision")
        await expect(decision.locator(".p-select-button__value")).to_have_text("")
        await form_field(dialog, "Confirmed By").get_by_role("textbox").fill(APPROVER)
        await snapshot(page, page.locator(".p-modal__card"), shots / "spend-form.png")

        # Submitting without a choice is refused, and nothing is submitted.
        await dialog.get_by_role("button", name="Submit").click()
        await expect(decision).to_contain_text("'decision' is a required property")
        assert backend_runs(stack, BROWSER_CONFIRM_BOOKING) == []
        await choose(page, decision, "confirm")
        await submit_as_a_person_would(page, dialog)
        await wait_for_flow_run(flow_run.id, completed)

    (run,) = backend_runs(stack, BROWSER_CONFIRM_BOOKING)
    assert run.confirmation is not None
    assert (run.confirmation.confirmed_by, run.confirmation.via) == (APPROVER, "person")
    assert run.confirmation.quote_id and run.manifest_digest == await digest_of(params)


async def digest_of(params: dict[str, object]) -> str:
    """Return the manifest digest of a deployment run's ``training`` parameter."""
    from prefect_ito.parameters import BookingClaim, TrainingParameters

    training = TrainingParameters.model_validate(params["training"])
    return training.to_request(BookingClaim(booking_id=training.booking)).digest()


async def submit_as_a_person_would(page: Page, dialog: Locator) -> None:
    """Submit the form; the modal closes only once the server has accepted the input.

    Prefect's SQLite server now and then answers a write with "database is locked" on a busy
    machine, and the UI says "Something went wrong": a person submits again, and so does this.
    """
    from playwright.async_api import expect

    for attempt in range(2):
        await dialog.get_by_role("button", name="Submit").click()
        try:
            await expect(dialog).to_be_hidden(timeout=30_000)
            return
        except AssertionError:
            failed = page.get_by_text("Something went wrong")
            if attempt or not await failed.count():
                raise
            await failed.first.wait_for(state="visible")
