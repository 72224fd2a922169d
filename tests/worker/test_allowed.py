"""The prefect-ito worker's own list of flows, and how it judges a deployment by it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prefect_ito.worker import (
    DEFAULT_FLOWS,
    FLOWS_VARIABLE,
    PULL_STEPS_VARIABLE,
    AllowedFlows,
    AllowedPullSteps,
    ItoProcessWorker,
)
from prefect_ito.worker.allowed import Admission, module_path_of
from prefect_ito.worker.process import ItoProcessJobConfiguration

TEMPLATE = Path(__file__).resolve().parents[2] / "deployments" / "process-base-job-template.json"


@pytest.mark.parametrize(
    ("entrypoint", "module_path"),
    [
        ("prefect_ito.flows.ito_training", "prefect_ito.flows.ito_training"),
        ("prefect_ito/flows.py:ito_training", "prefect_ito.flows.ito_training"),
        ("./prefect_ito/flows.py:ito_cancel_training", "prefect_ito.flows.ito_cancel_training"),
        ("/opt/prefect-ito/prefect_ito/flows.py:ito_training", None),  # absolute: whose file?
        ("../prefect_ito/flows.py:ito_training", None),
        ("prefect_ito/flows.txt:ito_training", None),
        ("flows.py:Trainer.train", None),  # a method names no module path
        ("evil.py:evil", "evil.evil"),
        ("ito_training", None),
        ("", None),
    ],
)
def test_an_entrypoint_is_read_as_a_module_path(entrypoint: str, module_path: str | None):
    assert module_path_of(entrypoint) == module_path


def test_the_list_is_the_argument_else_the_environment_else_the_default(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv(FLOWS_VARIABLE, raising=False)
    assert AllowedFlows.configured().entrypoints == DEFAULT_FLOWS
    monkeypatch.setenv(FLOWS_VARIABLE, "prefect_ito.flows.ito_cancel_training, ")
    assert AllowedFlows.configured().entrypoints == ("prefect_ito.flows.ito_cancel_training",)
    assert AllowedFlows.configured(["prefect_ito/flows.py:ito_training"]).entrypoints == (
        "prefect_ito.flows.ito_training",
    )


def test_a_list_that_names_no_flow_is_refused():
    with pytest.raises(ValueError, match="names no flow by module path"):
        AllowedFlows(["/tmp/evil.py:evil"])
    with pytest.raises(ValueError, match="at least one flow"):
        AllowedFlows([])


def _deployment(entrypoint: str, pull_steps: list[dict[str, Any]] | None = None) -> Any:
    return SimpleNamespace(entrypoint=entrypoint, pull_steps=pull_steps)


def test_a_shipped_deployment_is_admitted_by_either_entrypoint_with_the_pull_steps_it_allows():
    directory = {"prefect.deployments.steps.set_working_directory": {"directory": "/opt/x"}}
    allowed = AllowedFlows(
        DEFAULT_FLOWS,
        AllowedPullSteps(["prefect.deployments.steps.set_working_directory=/opt/x"]),
    )
    installed = allowed.judge(_deployment("prefect_ito.flows.ito_training"), "ito-training")
    checkout = allowed.judge(
        _deployment("prefect_ito/flows.py:ito_training", [directory]), "ito-training"
    )

    assert installed == Admission("prefect_ito.flows.ito_training")
    assert checkout == Admission("prefect_ito.flows.ito_training", pull_steps=(directory,))
    assert checkout.pull_step_names == ("prefect.deployments.steps.set_working_directory",)


def test_by_default_a_deployment_with_a_pull_step_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv(PULL_STEPS_VARIABLE, raising=False)
    allowed = AllowedFlows.configured()
    step = {"prefect.deployments.steps.set_working_directory": {"directory": "/opt/x"}}

    verdict = allowed.judge(
        _deployment("prefect_ito/flows.py:ito_training", [step]), "ito-training"
    )

    assert verdict == (
        "Refused by the prefect-ito worker: the deployment's pull step "
        "'prefect.deployments.steps.set_working_directory' is not one this worker runs "
        "(allowed: none; a worker is given its own with --allow-pull-step)."
    )


def test_another_flow_is_refused_with_a_message_that_says_why():
    allowed = AllowedFlows(DEFAULT_FLOWS)

    other = allowed.judge(_deployment("evil.py:evil"), "evil")
    no_deployment = allowed.judge(None, "ito-training")
    # An allowed entrypoint under another flow's name: what Prefect shows would not be what runs.
    renamed = allowed.judge(_deployment("prefect_ito.flows.ito_training"), "ito-cancel-training")

    assert other == (
        "Refused by the prefect-ito worker: the deployment's entrypoint 'evil.py:evil' is not a "
        f"flow this worker runs ({', '.join(DEFAULT_FLOWS)})."
    )
    assert isinstance(no_deployment, str) and "has no deployment" in no_deployment
    assert isinstance(renamed, str) and "'ito-cancel-training'" in renamed


async def test_the_template_and_job_variables_cannot_set_the_command_env_or_directory(
    tmp_path: Path, prefect_server: str
):
    template = json.loads(TEMPLATE.read_text())
    template["job_configuration"].update(
        command="sh -c 'echo $ITO_COMPUTE_TOKEN'", env={"PYTHONPATH": "/attacker"}
    )
    template["variables"]["properties"]["working_dir"] = {"type": "string"}
    values = {
        "command": "curl attacker",
        "env": {"PREFECT_API_URL": "http://attacker"},
        "env.PYTHONSTARTUP": "/attacker/x.py",
        "working_dir": str(tmp_path),
        "stream_output": False,
    }

    configuration = await ItoProcessJobConfiguration.from_template_and_values(
        template, values, client=None
    )

    assert (configuration.command, configuration.env, configuration.working_dir) == (None, {}, None)
    assert configuration.stream_output is False  # what does not decide what runs is still read


def test_the_worker_type_is_found_as_prefect_finds_worker_types():
    from prefect.workers.base import BaseWorker

    assert BaseWorker.get_worker_class_from_type("prefect-ito") is ItoProcessWorker
    default = ItoProcessWorker.get_default_base_job_template()
    assert not {"command", "env", "working_dir"} & set(default["variables"]["properties"])
    assert not {"command", "env", "working_dir"} & set(default["job_configuration"])


def test_a_worker_whose_flow_does_not_import_does_not_start(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(FLOWS_VARIABLE, raising=False)
    with pytest.raises(ImportError, match=r"prefect_ito\.nope"):
        ItoProcessWorker(work_pool_name="ito-process", flows=["prefect_ito.nope.ito_training"])

    worker = ItoProcessWorker(work_pool_name="ito-process")
    assert worker.allowed.entrypoints == DEFAULT_FLOWS


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        ((), "The prefect-ito worker runs the installed prefect_ito.flows.ito_training."),
        (
            ({"prefect.deployments.steps.set_working_directory": {"directory": "/opt/x"}},),
            "The prefect-ito worker runs the installed prefect_ito.flows.ito_training after the "
            "deployment's pull steps it allows (prefect.deployments.steps.set_working_directory).",
        ),
    ],
)
def test_every_flow_run_it_starts_says_first_which_worker_runs_it(
    steps: tuple[dict[str, Any], ...], said: str, caplog: pytest.LogCaptureFixture
):
    # A flow run without this line ran on another worker: docs/security.md says to look for it.
    import logging

    logger = logging.getLogger("test-flow-run")
    worker = SimpleNamespace(get_flow_run_logger=lambda _: logger)
    admission = Admission(entrypoint="prefect_ito.flows.ito_training", pull_steps=steps)

    with caplog.at_level(logging.INFO, logger="test-flow-run"):
        ItoProcessWorker._say_admitted(worker, SimpleNamespace(), admission)  # type: ignore[arg-type]

    assert [record.getMessage() for record in caplog.records] == [said]
