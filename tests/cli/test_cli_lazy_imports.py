"""The package and the settings the commands read import Prefect only when it is needed.

Each check runs in a fresh interpreter: in this one, Prefect is loaded already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import prefect_ito


def python(code: str, cwd: Path, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def retries_read(cwd: Path, **env: str) -> str:
    """Return the retries a fresh process in ``cwd``, with a home of its own, reads from its
    settings, and whether it imported Prefect to read them."""
    code = (
        "import sys\n"
        "from prefect_ito.settings import current_settings\n"
        "print(current_settings().max_retries, 'prefect' in sys.modules)\n"
    )
    home = cwd / "home"
    return python(code, cwd, HOME=str(home), PREFECT_HOME=str(home / ".prefect"), **env)


@pytest.mark.slow
def test_the_public_names_are_all_there_and_imported_on_first_use(tmp_path):
    code = (
        "import sys, prefect_ito\n"
        "print('prefect' in sys.modules)\n"
        "from prefect_ito import *\n"
        "print(sorted(n for n in prefect_ito.__all__ if n not in globals()))\n"
        "print('prefect' in sys.modules)\n"
    )
    assert python(code, tmp_path).splitlines() == ["False", "[]", "True"]
    assert prefect_ito.__all__ == sorted(prefect_ito.__all__)
    assert set(prefect_ito.__all__) <= set(dir(prefect_ito))


@pytest.mark.slow
def test_the_environment_alone_is_read_without_prefect_when_no_file_could_set_them(tmp_path):
    assert retries_read(tmp_path, PREFECT_INTEGRATIONS_ITO_MAX_RETRIES="7") == "7 False"


@pytest.mark.slow
def test_a_file_prefect_reads_still_sets_them_through_prefect(tmp_path):
    (tmp_path / "prefect.toml").write_text("[integrations.ito]\nmax_retries = 4\n")
    assert retries_read(tmp_path) == "4 True"


@pytest.mark.slow
def test_a_profile_that_names_them_is_read_through_prefect(tmp_path):
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        'active = "ito"\n[profiles.ito]\nPREFECT_INTEGRATIONS_ITO_MAX_RETRIES = "5"\n'
    )
    code = (
        "from prefect_ito.settings import current_settings\nprint(current_settings().max_retries)"
    )
    home = tmp_path / "home"
    env = {"HOME": str(home), "PREFECT_PROFILES_PATH": str(profiles)}
    assert python(code, tmp_path, **env) == "5"


@pytest.mark.slow
def test_the_request_fields_and_the_quote_command_import_no_prefect(tmp_path):
    code = (
        "import sys\n"
        "from prefect_ito.request_fields import TrainingFields\n"
        "from prefect_ito.cli import options, quote\n"
        "fields = TrainingFields[str].parse({'booking': 'bk-1', 'model_size': '8B',\n"
        "    'data': ['catalog://x'], 'target': 't', 'budget_usd': 1})\n"
        "print(fields.booking, 'prefect' in sys.modules)\n"
        "from prefect_ito.parameters import TrainingParameters\n"
        "print(issubclass(TrainingParameters, TrainingFields), 'prefect' in sys.modules)\n"
    )
    assert python(code, tmp_path).splitlines() == ["bk-1 False", "True True"]
