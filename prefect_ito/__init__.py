"""prefect-ito: run ML training on a completed Itô compute booking via the desk backend.

Importing the package registers its blocks with Prefect (through the ``prefect.collections``
entry point), so ``prefect block register -m prefect_ito`` and the Prefect UI know them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoBooking, ItoCredentials, ItoSpendAuthorization
from prefect_ito.exceptions import ItoError
from prefect_ito.jobs import ItoTrainingJob, ItoTrainingRun
from prefect_ito.reporting.chaining import emit_booking_completed

__all__ = [
    "ItoBooking",
    "ItoClient",
    "ItoCredentials",
    "ItoError",
    "ItoSpendAuthorization",
    "ItoTrainingJob",
    "ItoTrainingRun",
    "__version__",
    "emit_booking_completed",
]
