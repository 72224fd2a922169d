"""A prefect-ito worker's flow process: the pull steps its worker admitted, then Prefect's engine.

``python -m prefect_ito.worker.engine`` is ``python -m prefect.engine`` with one step before it:
it runs the pull steps the worker judged (:mod:`prefect_ito.worker.pull_steps`), which the
worker hands over in ``ADMITTED_VARIABLE``, and changes into the directory they leave, as
Prefect's own loading of a deployment does. It never reads the deployment's pull steps from
Prefect again: a deployment changed after the worker judged it changes nothing here. The flow
itself is the one the worker admitted (``PREFECT__FLOW_ENTRYPOINT``, set by the worker).

The process worker starts it when a deployment has pull steps; a Kubernetes job manifest names it
as its container's command, so that a pod does the same. No module of the workers imports it (it
runs as ``__main__``, and would run a second time under its own name).
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import warnings
from collections.abc import Sequence
from typing import Any

from prefect_ito.worker.pull_steps import ADMITTED_VARIABLE

__all__ = ["main", "run_pull_steps"]


def run_pull_steps(steps: Sequence[dict[str, dict[str, Any]]]) -> str | None:
    """Run each step with its inputs as written; return the directory they leave, if any.

    No template is filled (the worker refuses a step that holds one) and nothing is installed.
    """
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.utilities.importtools import import_object

    outputs: dict[str, Any] = {}
    for step in steps:
        ((function, inputs),) = step.items()
        arguments = {key: value for key, value in inputs.items() if key != "id"}
        result = import_object(function)(**arguments)
        if inspect.iscoroutine(result):
            result = run_coro_as_sync(result)
        if isinstance(result, dict):
            outputs.update(result)
    directory = outputs.get("directory")
    return str(directory) if directory else None


def main() -> None:
    """Run the admitted pull steps, then Prefect's engine as ``python -m prefect.engine``."""
    steps = json.loads(os.environ.pop(ADMITTED_VARIABLE, "[]"))
    directory = run_pull_steps(steps)
    if directory is not None:
        os.chdir(directory)
    with warnings.catch_warnings():
        # prefect.engine is imported already (by this package's worker modules); running it as
        # __main__ again is what `python -m prefect.engine` does too, so the warning says nothing.
        warnings.filterwarnings("ignore", "'prefect.engine' found in sys.modules", RuntimeWarning)
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
