"""The prefect-ito worker: a Prefect worker type whose flows come from its own configuration.

Prefect finds it through the package's ``prefect.collections`` entry point (this module), so
``prefect worker start --type prefect-ito`` starts it; ``prefect-ito worker`` does too.
"""

from __future__ import annotations

from prefect_ito.worker.allowed import DEFAULT_FLOWS, FLOWS_VARIABLE, AllowedFlows
from prefect_ito.worker.process import WORKER_TYPE, ItoProcessWorker

__all__ = ["DEFAULT_FLOWS", "FLOWS_VARIABLE", "WORKER_TYPE", "AllowedFlows", "ItoProcessWorker"]
