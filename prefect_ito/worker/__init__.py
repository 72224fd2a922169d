"""The prefect-ito workers: Prefect worker types whose flows come from their own configuration.

Prefect finds them through the package's ``prefect.collections`` entry point (this module), so
``prefect worker start --type prefect-ito`` starts the process worker, and
``prefect worker start --type prefect-ito-kubernetes`` the Kubernetes one when prefect-kubernetes
is installed; ``prefect-ito worker`` (``--kubernetes``) does too.
"""

from __future__ import annotations

import importlib.util

from prefect_ito.worker.allowed import DEFAULT_FLOWS, FLOWS_VARIABLE, AllowedFlows
from prefect_ito.worker.process import WORKER_TYPE, ItoProcessWorker
from prefect_ito.worker.pull_steps import PULL_STEPS_VARIABLE, AllowedPullSteps

__all__ = [
    "DEFAULT_FLOWS",
    "FLOWS_VARIABLE",
    "PULL_STEPS_VARIABLE",
    "WORKER_TYPE",
    "AllowedFlows",
    "AllowedPullSteps",
    "ItoProcessWorker",
    "kubernetes_available",
]


def kubernetes_available() -> bool:
    """Tell whether prefect-kubernetes is installed, which the Kubernetes worker is built on."""
    return importlib.util.find_spec("prefect_kubernetes") is not None


if kubernetes_available():
    # Imported for its worker type: Prefect knows a worker type by the classes defined.
    import prefect_ito.worker.kubernetes  # noqa: F401
