"""A run of the suite leaves nothing in the temporary directory, however it ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "code"),
    [(["--order-seed", "abc"], 4), (["--collect-only", "-q", "tests/test_run_directory.py"], 0)],
    ids=["usage-error", "collected"],
)
def test_a_run_leaves_no_run_directory_behind(tmp_path: Path, args: list[str], code: int):
    # Before, a run that pytest stopped at its options (a usage error) left its directory for good.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PREFECT_ITO_"))}
    ended = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", *args],
        cwd=CHECKOUT, env={**env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip

    assert ended.returncode == code, ended.stdout + ended.stderr
    assert list(tmp_path.glob("prefect-ito-run-*")) == []
