"""Which of a deployment's pull steps the prefect-ito worker runs: its own configuration.

A pull step runs code where the token lives (a ``run_shell_script`` step is a shell command, a
``git_clone`` or ``set_working_directory`` step decides which code the flow imports), and a
deployment's pull steps are anyone's to edit who reaches the Prefect API. So the worker runs a
deployment's pull steps only when each is one it was configured to allow, and refuses the flow
run otherwise, naming the step. By default it allows none.

An allowed step is named by its step function, as a deployment writes it, optionally with the
one value it must have: ``git_clone`` with the repository it may clone (required: a clone of
any repository is anyone's code), ``set_working_directory`` with the directory. The list comes
from, in this order:

1. the worker's own argument (``prefect-ito worker --allow-pull-step …``);
2. the environment variable ``PREFECT_INTEGRATIONS_ITO_WORKER_PULL_STEPS`` (entries separated by
   commas), read when the worker starts;
3. none.

An allowed step runs with its inputs exactly as the deployment wrote them when the worker
judged it: a step whose inputs hold a template (``{{ … }}``, which Prefect fills from blocks,
variables or the process's environment, the token's included) or that asks to install packages
(``requires``) is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefect_ito.settings import ENV_PREFIX

__all__ = [
    "ADMITTED_VARIABLE",
    "ENGINE_MODULE",
    "PINNED_INPUTS",
    "PULL_STEPS_VARIABLE",
    "REFUSAL",
    "AllowedPullSteps",
    "PullStep",
]

PULL_STEPS_VARIABLE = f"{ENV_PREFIX}WORKER_PULL_STEPS"
"""The environment variable that lists the pull steps a worker runs (comma-separated)."""

ADMITTED_VARIABLE = f"{ENV_PREFIX}WORKER_ADMITTED_PULL_STEPS"
"""What the worker hands its flow process: the pull steps it admitted, as JSON (a list)."""

ENGINE_MODULE = "prefect_ito.worker.engine"
"""The flow process's module (``python -m``), which runs them (:mod:`prefect_ito.worker.engine`)."""

PINNED_INPUTS: Mapping[str, str] = {
    "prefect.deployments.steps.git_clone": "repository",
    "prefect.deployments.steps.set_working_directory": "directory",
}
"""The step functions an entry may pin, and the input the pinned value is compared with."""

REQUIRED_VALUE = frozenset({"prefect.deployments.steps.git_clone"})
"""Step functions that are allowed only with their value: any repository is anyone's code."""

PullStep = dict[str, dict[str, Any]]
"""One pull step as a deployment stores it: ``{function: {input: value, ...}}``."""

REFUSAL = "Refused by the prefect-ito worker: "
"""How every refusal's message begins (the flow run's state message, and its log)."""


class AllowedPullSteps:
    """The pull steps one worker runs: step functions, each with the values it may have."""

    def __init__(self, entries: Iterable[str]) -> None:
        allowed: dict[str, set[str] | None] = {}
        for entry in entries:
            function, value = _parse(entry)
            values = allowed.setdefault(function, set())
            if value is None:
                allowed[function] = None  # any value
            elif values is not None:
                values.add(value)
        self._allowed = allowed

    @classmethod
    def configured(cls, entries: Sequence[str] | None = None) -> AllowedPullSteps:
        """Return the worker's list: ``entries``, else the environment's, else none."""
        if entries:
            return cls(entries)
        listed = os.environ.get(PULL_STEPS_VARIABLE, "")
        return cls(entry for entry in listed.split(",") if entry.strip())

    @property
    def entries(self) -> tuple[str, ...]:
        """The list as the worker was given it, one entry per function and value."""
        return tuple(
            entry
            for function, values in self._allowed.items()
            for entry in (
                [function] if values is None else [f"{function}={v}" for v in sorted(values)]
            )
        )

    def judge(self, steps: Sequence[Any] | None) -> tuple[PullStep, ...] | str:
        """Return the deployment's pull steps if the worker runs every one, else the refusal."""
        judged: list[PullStep] = []
        for step in steps or []:
            verdict = self._judge_step(step)
            if isinstance(verdict, str):
                return REFUSAL + verdict
            judged.append(verdict)
        return tuple(judged)

    def _judge_step(self, step: Any) -> PullStep | str:
        if not (isinstance(step, dict) and len(step) == 1):
            return "a pull step of the deployment is not one step function with its inputs."
        ((function, inputs),) = step.items()
        inputs = inputs if inputs is not None else {}
        if not isinstance(inputs, dict):
            return f"the deployment's pull step {function!r} has no inputs by name."
        if function not in self._allowed:
            allowed = ", ".join(self.entries) or "none"
            return (
                f"the deployment's pull step {function!r} is not one this worker runs "
                f"(allowed: {allowed}; a worker is given its own with --allow-pull-step)."
            )
        if "requires" in inputs:
            return (
                f"the deployment's pull step {function!r} asks to install packages "
                "('requires'); this worker installs none."
            )
        if _has_template(inputs):
            return (
                f"the deployment's pull step {function!r} has a template ({{{{ … }}}}) in its "
                "inputs; this worker runs pull steps only as written."
            )
        values = self._allowed[function]
        if values is not None:
            name = PINNED_INPUTS[function]
            value = inputs.get(name)
            if value not in values:
                return (
                    f"the deployment's pull step {function!r} has {name} {value!r}, which "
                    f"this worker does not allow ({', '.join(sorted(values))})."
                )
        return {function: dict(inputs)}


def _parse(entry: str) -> tuple[str, str | None]:
    """Read ``FUNCTION`` or ``FUNCTION=VALUE``; raise ValueError naming what is wrong."""
    function, _, value = entry.strip().partition("=")
    function, value = function.strip(), value.strip()
    if not function or not all(part.isidentifier() for part in function.split(".")):
        raise ValueError(f"{entry!r} names no step function (e.g. {next(iter(PINNED_INPUTS))})")
    if value and function not in PINNED_INPUTS:
        raise ValueError(f"{function} takes no value: it is allowed with any inputs or not at all")
    if not value and function in REQUIRED_VALUE:
        raise ValueError(
            f"{function} needs the {PINNED_INPUTS[function]} it may use: "
            f"{function}={PINNED_INPUTS[function].upper()}"
        )
    return function, value or None


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(_has_template(key) or _has_template(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(_has_template(item) for item in value)
    return False
