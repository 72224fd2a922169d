"""End to end in a browser: a person approves a loss-spike restart in the Prefect UI.

Headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright) opens the UI that
``prefect server start`` serves, presses Resume on the suspended run, fills the form Prefect
generates from the :class:`~prefect_ito.approval.RestartDecision` schema and submits it. SQLite
only: the UI is the same for every database. Without Chromium or Playwright the test is skipped,
unless ``PREFECT_ITO_REQUIRE_BROWSER=1`` (set by ``.ci/run``) turns the skip into a failure.
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
    Stack,
    backend_runs,
    completed,
    suspend_on_spike,
    wait_for_flow_run,
)

from prefect_ito.contract import DecisionChoice, RunState

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_BROWSER = "PREFECT_ITO_REQUIRE_BROWSER"
HOW_TO_RUN_BROWSER = (
    "Browser approval skipped: install Debian's chromium (apt-get install chromium, which "
    "provides /usr/bin/chromium) and the dev dependencies (uv sync, for playwright), or run "
    ".ci/run, which does both"
)
UI_TIMEOUT_MS = 60_000
"""Generous: the UI is a Vue app that loads, then polls the API, on a busy 2-core machine."""

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


@pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
async def test_a_person_approves_in_the_prefect_ui(
    chromium: Path, stack: Stack, page: Page, tmp_path: Path
):
    """Press Resume on the suspended run, fill the generated form, submit; the run completes.

    ``chromium`` comes first so that a machine without a browser skips before the stack starts.
    """
    from playwright.async_api import expect

    suspended = await suspend_on_spike(BROWSER_BOOKING)
    ui_url = stack.api_url.removesuffix("/api")

    async with screenshot_on_failure(page, tmp_path / "failure.png"):
        await page.goto(f"{ui_url}/runs/flow-run/{suspended.id}")
        await page.get_by_role("button", name="Resume", exact=True).click()

        dialog = page.get_by_role("dialog").filter(has_text="Resume Flow Run")
        # The spike's context is rendered above the form, so the person knows what they decide.
        await expect(dialog).to_contain_text("Loss spike in")
        await expect(dialog).to_contain_text(BROWSER_BOOKING)
        approve = form_field(dialog, "Approve").get_by_role("switch")
        await expect(approve).not_to_be_checked()  # rejecting is the default
        await approve.click()
        await expect(approve).to_be_checked()
        await form_field(dialog, "Decided By").get_by_role("textbox").fill(APPROVER)
        await form_field(dialog, "Reason").get_by_role("textbox").fill(REASON)
        await dialog.get_by_role("button", name="Submit").click()
        # The modal closes only once the server has accepted the input.
        await expect(dialog).to_be_hidden()

        await wait_for_flow_run(suspended.id, completed)

    (run,) = backend_runs(stack, BROWSER_BOOKING)
    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, d.decided_by, d.reason) for d in run.decisions] == [
        (DecisionChoice.APPROVE, APPROVER, REASON)
    ]
