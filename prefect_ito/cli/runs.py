"""``prefect-ito runs show``: training runs as the backend has them, read-only.

It asks the backend, never Prefect, and only reads (``GET`` requests): it works for runs no flow
run supervises, and never submits, cancels or decides anything.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from cyclopts import App, Parameter
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_ito.backend import provenance
from prefect_ito.backend.client import ItoClient
from prefect_ito.cli.errors import respond
from prefect_ito.cli.local import IDEMPOTENCY_KEY_PATTERN, check_id
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import InvalidParameters, RunNotFound
from prefect_ito.reporting import cards

__all__ = ["runs", "show"]

runs = App(name="runs", help="Read training runs from the backend (read-only; never Prefect).")

_console = Console()
_SELECTORS = "give exactly one of RUN_ID, --idempotency-key and --booking"


@runs.command
def show(
    run_id: Annotated[str | None, Parameter(help="The backend's training run id.")] = None,
    /,
    *,
    idempotency_key: Annotated[
        str | None, Parameter(help="Instead of RUN_ID: the run this submission key created.")
    ] = None,
    booking: Annotated[
        str | None, Parameter(help="Instead of RUN_ID: every run on this booking.")
    ] = None,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Show training runs as the backend has them: one by id or idempotency key, or a booking's.

    Only reads the backend. A run it does not know ends with exit code 9; a booking without
    runs lists none.
    """
    selectors = (run_id, idempotency_key, booking)
    respond(json_output, _show(selectors, api_url, credentials), _print_runs)


def _selection(run_id: str | None, key: str | None, booking: str | None) -> dict[str, str]:
    """Return the one selector given, checked; refuse none, several, or a malformed one."""
    given = {
        name: value
        for name, value in (("run_id", run_id), ("idempotency_key", key), ("booking", booking))
        if value is not None
    }
    if len(given) != 1:
        raise InvalidParameters(_SELECTORS)
    ((name, value),) = given.items()
    if name == "idempotency_key":
        if not re.match(IDEMPOTENCY_KEY_PATTERN, value):
            raise InvalidParameters(
                "idempotency_key: must be 1 to 255 letters, digits or ._:- starting with a "
                "letter or digit",
                field=name,
            )
    else:
        check_id(value, name)
    return given


async def _show(
    selectors: tuple[str | None, str | None, str | None],
    api_url: str | None,
    credentials: str | None,
) -> dict[str, Any]:
    selection = _selection(*selectors)  # before anything reaches the backend
    async with await open_client(api_url, credentials) as client:
        found = await _read(client, selection)
    return {"runs": found}


async def _read(client: ItoClient, selection: dict[str, str]) -> list[TrainingRun]:
    if "run_id" in selection:
        run_id = selection["run_id"]
        try:
            return [await client.get_training_run(run_id)]
        except RunNotFound as error:
            raise RunNotFound(
                f"the backend knows no training run {run_id!r} ({error.message})",
                status_code=error.status_code,
                request_id=error.request_id,
            ) from None
    if "booking" in selection:
        return await client.list_runs(booking_id=selection["booking"])
    key = selection["idempotency_key"]
    found = await client.list_runs(idempotency_key=key)
    if not found:
        raise RunNotFound(f"the backend knows no run created with idempotency key {key!r}")
    return found


def _print_runs(shown: dict[str, Any]) -> None:
    found: list[TrainingRun] = shown["runs"]
    if not found:
        _console.print("No training runs on this booking.")
    elif len(found) == 1:
        # The run's summary is the flow's own (it imports Prefect): asked for only to show it.
        from prefect_ito.cli import views
        from prefect_ito.reporting.report import TrainingSummary

        views.print_summary(_console, TrainingSummary.of(found[0]))
        _print_pending(found[0])
    else:
        _console.print(_table(found))
    for backend in provenance.seen():
        _console.print(backend.describe(), markup=False, highlight=False, soft_wrap=True)


def _print_pending(run: TrainingRun) -> None:
    action = run.pending_action
    if action is not None:
        _console.print(
            "[bold yellow]Pending decision:[/] "
            + escape(
                f"{action.kind.value} at step {action.step:,} in {action.stage} "
                f"(action {action.action_id})"
            ),
            soft_wrap=True,
        )


def _table(found: list[TrainingRun]) -> Table:
    table = Table(title=f"Training runs on {escape(found[0].booking_id)}", title_justify="left")
    table.add_column("run", no_wrap=True)  # an id to copy: never broken or cut
    for column in ("state", "stage", "pending decision", "spend (USD)", "created"):
        table.add_column(column)
    for run in found:
        spent = run.telemetry
        table.add_row(
            escape(run.run_id),
            escape(run.state.value),
            escape(run.current_stage or "—"),
            escape(run.pending_action.kind.value if run.pending_action else "—"),
            f"{spent.spend_usd:,.0f} of {spent.budget_usd:,.0f}",
            cards.when(run.created_at),
        )
    return table
