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
