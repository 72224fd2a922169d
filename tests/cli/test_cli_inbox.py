"""``prefect-ito inbox`` without a usable Prefect server ends with one line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def inbox(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", "inbox", "--json"],
        env={**environment, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_without_a_server_it_says_one_is_needed():
    result = inbox()
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "PREFECT_SERVER_REQUIRED"
    assert "Traceback" not in result.stderr


def test_a_server_that_does_not_answer_is_one_line():
    result = inbox(PREFECT_API_URL="http://127.0.0.1:9/api")
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "PREFECT_UNREACHABLE"
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_an_entry_names_the_flow_run_s_form_for_what_it_can_do(monkeypatch):
    # Before: "Form: <link>" under a spend, a form that can only decline or recheck.
    from rich.console import Console

    from prefect_ito.cli import inbox as command

    console = Console(width=100, record=True)
    monkeypatch.setattr(command, "_console", console)
    entry = {
        "flow_run_id": "f-1", "flow_run_name": "quiet-heron", "kind": "spend",
        "asked": "Confirm or decline a training spend", "why": None, "evidence": None,
        "since": None, "deadline": None, "held": None, "link": "http://127.0.0.1:4200/runs/flow-run/f-1",
        "command": "prefect-ito confirm quote_1 [--decline]",
    }  # fmt: skip

    command._show_entry(entry)
    command._show_entry({**entry, "kind": "restart", "command": "prefect-ito decide f-1"})

    said = " ".join(console.export_text().split())
    assert "Form:" not in said
    assert (
        "Flow run: http://127.0.0.1:4200/runs/flow-run/f-1 (its form can only decline, or "
        "recheck once confirmed at the backend" in said
    )
    assert "(its form only rechecks once decided at the backend" in said
    assert "Answer: prefect-ito confirm quote_1 [--decline]" in said
