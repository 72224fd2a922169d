"""Which flows the prefect-ito worker runs: its own configuration, never anything in Prefect.

A deployment names its flow by an entrypoint, either a module path
(``prefect_ito.flows.ito_training``, the installed-package route) or a file path relative to
the deployment's code (``prefect_ito/flows.py:ito_training``, the checkout route). Both are
read here as a module path and compared with the worker's list; the worker then runs the
installed module of that name, never the deployment's storage, and only the pull steps it
allows (:mod:`prefect_ito.worker.pull_steps`).

The list comes from, in this order:

1. the worker's own argument (``prefect-ito worker --flow …``);
2. the environment variable ``PREFECT_INTEGRATIONS_ITO_WORKER_FLOWS`` (module paths separated by
   commas), read when the worker starts;
3. :data:`DEFAULT_FLOWS`: prefect-ito's own training, attach and cancel flows.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from prefect_ito.settings import ENV_PREFIX
from prefect_ito.worker.pull_steps import REFUSAL, AllowedPullSteps, PullStep

if TYPE_CHECKING:
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.flows import Flow

__all__ = [
    "DEFAULT_FLOWS",
    "FLOWS_VARIABLE",
    "Admission",
    "AllowedFlows",
    "module_path_of",
]

DEFAULT_FLOWS: tuple[str, ...] = (
    "prefect_ito.flows.ito_training",
    "prefect_ito.flows.ito_attach_training",
    "prefect_ito.flows.ito_cancel_training",
)
"""The flows a prefect-ito worker runs unless it is configured otherwise."""

FLOWS_VARIABLE = f"{ENV_PREFIX}WORKER_FLOWS"
"""The environment variable that lists the flows a worker runs (module paths, comma-separated)."""


@dataclass(frozen=True)
class Admission:
    """A flow run the worker will run: which installed flow, and what of Prefect's it ignores."""

    entrypoint: str
    """The module path of the allowed flow the flow process imports."""
    pull_steps: tuple[PullStep, ...] = ()
    """The deployment's pull steps as the worker judged them: what the flow process runs."""

    @property
    def pull_step_names(self) -> tuple[str, ...]:
        """The step functions of :attr:`pull_steps`, in order."""
        return tuple(name for step in self.pull_steps for name in step)


def module_path_of(entrypoint: str) -> str | None:
    """Return the module path a deployment's entrypoint names, or None if it names none.

    ``prefect_ito/flows.py:ito_training`` and ``prefect_ito.flows.ito_training`` are the same
    flow. An absolute or parent path, a method (``Class.method``) or a name that is no Python
    identifier names no module path: such a deployment is refused.
    """
    if ":" in entrypoint:
        path, name = entrypoint.rsplit(":", 1)
        file = PurePosixPath(path)
        if file.is_absolute() or file.suffix != ".py" or ".." in file.parts:
            return None
        parts = [*file.with_suffix("").parts, name]
    else:
        parts = entrypoint.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


class AllowedFlows:
    """The flows one worker runs, by module path; each is imported from the installed package.

    Args:
        entrypoints: The flows, by module path.
        pull_steps: The pull steps a deployment of them may have (default: none).
    """

    def __init__(
        self, entrypoints: Iterable[str], pull_steps: AllowedPullSteps | None = None
    ) -> None:
        allowed: list[str] = []
        for entrypoint in entrypoints:
            path = module_path_of(entrypoint.strip())
            if path is None:
                raise ValueError(
                    f"{entrypoint!r} names no flow by module path (e.g. "
                    "prefect_ito.flows.ito_training)"
                )
            allowed.append(path)
        if not allowed:
            raise ValueError("a prefect-ito worker needs at least one flow to run")
        self.entrypoints: tuple[str, ...] = tuple(dict.fromkeys(allowed))
        self.pull_steps = pull_steps if pull_steps is not None else AllowedPullSteps(())

    @classmethod
    def configured(
        cls, entrypoints: Sequence[str] | None = None, pull_steps: Sequence[str] | None = None
    ) -> AllowedFlows:
        """Return the worker's lists: each the argument, else the environment's, else the
        default (prefect-ito's flows; no pull step)."""
        steps = AllowedPullSteps.configured(pull_steps)
        if entrypoints:
            return cls(entrypoints, steps)
        listed = os.environ.get(FLOWS_VARIABLE, "")
        named = [entry for entry in listed.split(",") if entry.strip()]
        return cls(named or DEFAULT_FLOWS, steps)

    def flow(self, entrypoint: str) -> Flow[..., Any]:
        """Import an allowed flow from the installed package (once per worker)."""
        if entrypoint not in self.entrypoints:
            raise ValueError(f"{entrypoint} is not a flow this worker runs")
        return _import_flow(entrypoint)

    def check_importable(self) -> None:
        """Import every allowed flow now, so that a misspelt one stops the worker at its start."""
        for entrypoint in self.entrypoints:
            self.flow(entrypoint)

    def judge(
        self, deployment: DeploymentResponse | None, flow_name: str | None
    ) -> Admission | str:
        """Admit a flow run of ``deployment`` (whose flow is named ``flow_name``), or say why not.

        Returns:
            The :class:`Admission`, or the refusal's message, which names the reason.
        """
        if deployment is None:
            return (
                f"{REFUSAL}the flow run has no deployment, and this "
                "worker runs only deployments of the flows it is configured for."
            )
        entrypoint = deployment.entrypoint or ""
        path = module_path_of(entrypoint)
        if path not in self.entrypoints:
            return (
                f"{REFUSAL}the deployment's entrypoint {entrypoint!r} "
                f"is not a flow this worker runs ({', '.join(self.entrypoints)})."
            )
        assert path is not None  # in the list, so a module path
        expected = self.flow(path).name
        if flow_name != expected:
            return (
                f"{REFUSAL}the flow run's flow is {flow_name!r}, but "
                f"its deployment's entrypoint {entrypoint!r} is the flow {expected!r}."
            )
        steps = self.pull_steps.judge(deployment.pull_steps)
        if isinstance(steps, str):
            return steps
        return Admission(entrypoint=path, pull_steps=steps)


@functools.cache
def _import_flow(entrypoint: str) -> Flow[..., Any]:
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False)
