"""prefect-ito: run ML training on a completed Itô compute booking via the desk backend.

Importing the package registers its blocks with Prefect (through the ``prefect.collections``
entry point), so ``prefect block register -m prefect_ito`` and the Prefect UI know them.

The public names are imported when first used (PEP 562): most of them need Prefect, whose
import costs about two seconds, and the ``prefect-ito`` commands that never run a flow should
not pay for it. When Prefect is loaded already (it imports this package as a collection, and
``prefect block register -m prefect_ito`` does so too), the blocks are imported at once, so that
Prefect knows them as before.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
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

_WHERE = {
    "ItoBooking": "prefect_ito.blocks",
    "ItoClient": "prefect_ito.backend.client",
    "ItoCredentials": "prefect_ito.blocks",
    "ItoError": "prefect_ito.exceptions",
    "ItoSpendAuthorization": "prefect_ito.blocks",
    "ItoTrainingJob": "prefect_ito.jobs",
    "ItoTrainingRun": "prefect_ito.jobs",
    "emit_booking_completed": "prefect_ito.reporting.chaining",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if "prefect" in sys.modules:
    importlib.import_module("prefect_ito.blocks")  # registers the blocks with Prefect
