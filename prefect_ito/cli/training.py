"""``prefect-ito train | attach | demo | decide``.

``train``'s options are the fields of :class:`~prefect_ito.parameters.TrainingParameters`, and
``attach``'s those of :class:`~prefect_ito.parameters.SupervisionParameters`. Every expected
failure ends the command with one line and the exit code its outcome class states (see
:class:`prefect_ito.exceptions.ExitCode` and the table in ``docs/cli.md``). With ``--json`` each
ends with one JSON document instead (see :mod:`prefect_ito.cli.output`); ``train``, ``attach``
and ``demo`` put the flow run's final state and its run summary in its ``data``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

from cyclopts import Parameter
from prefect import Flow, State
from rich.console import Console

from prefect_ito.backend import provenance
from prefect_ito.cli import output, terminal, views
from prefect_ito.cli.errors import exit_with, run_command
from prefect_ito.cli.options import (
    CommandLineTraining,
    DataFile,
    Verbose,
    command_credentials,
    training_parameters,
)
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName
from prefect_ito.cli.train_checks import (
    Spend,
    check_backend,
    checked_id,
    nobody_to_confirm,
    spend_confirmer,
)
from prefect_ito.exceptions import (
    ExitCode,
    InvalidParameters,
    ItoError,
)
from prefect_ito.flows import ito_attach_training, ito_training
from prefect_ito.parameters import (
    SupervisionParameters,
    check_id,
    quote_submission_key,
)
from prefect_ito.supervision.outcomes import exit_code, outcome_error

__all__ = ["attach", "demo", "train"]

_console = Console()

Confirm = Annotated[
    str | None,
    Parameter(
        help="Confirm this quote (its id, from `prefect-ito quote` with the same options) at "
        "the backend with your own token, then run: once only, and only while the quote "
        "stands. A quote of another request is refused before anything is sent."
    ),
]
ConfirmNote = Annotated[
    str | None,
    Parameter(help="A note the backend keeps beside your confirmation (it records who you are)."),
]
AuthorizationName = Annotated[
    str | None,
    Parameter(
        help="Name of a saved ItoSpendAuthorization block, naming a standing authorization at "
        "the backend; the backend decides whether it covers the request."
    ),
]


def train(
    training: Annotated[CommandLineTraining, Parameter(name="*")],
    *,
    data_file: DataFile = None,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    confirm: Confirm = None,
    name: ConfirmNote = None,
    authorization: AuthorizationName = None,
    verbose: Verbose = False,
    json_output: JsonOption = False,
) -> None:
    """Run the training flow on a completed booking: a line per stage change, then a summary.

    Nothing is submitted unless the backend says a person confirmed the spend (at this
    terminal with your own token, with --confirm QUOTE_ID, or on the backend's page) or that a
    standing authorization (--authorization) covers it.
    """
    output.use_json(json_output)
    parameters = training_parameters(training, data_file)
    if confirm is not None and parameters.idempotency_key is None:
        # One quote, one submission: the same command again re-attaches to the run it made.
        parameters = parameters.model_copy(
            update={"idempotency_key": quote_submission_key(confirm)}
        )
    where = command_credentials(credentials, api_url)
    flow_parameters = {"training": parameters, "credentials": where, "authorization": authorization}
    # Bad options first, each named; then whether anyone here can confirm the spend.
    if confirm is not None:
        _fail_unless(checked_id(confirm))
    if confirm is None and authorization is None and not terminal.interactive():
        _fail(nobody_to_confirm())
    confirmed = None
    if not isinstance(where, str) and parameters.booking_block is None:  # no saved block
        # Whatever the backend can say before a flow run exists is asked before Prefect's
        # temporary server starts: a backend that is down, or a quote that cannot be
        # confirmed, ends the command in seconds, not after the server's start-up.
        run_command(check_backend(parameters, where, confirm, name))
        confirmed = confirm

    def confirmer() -> terminal.Confirmer | None:
        spend = Spend(confirm=confirm, note=name, authorization=authorization)
        return run_command(spend_confirmer(parameters, flow_parameters, spend, confirmed))

    _run_flow(ito_training, flow_parameters, verbose, confirmer=confirmer)


def _fail_unless(error: ItoError | None) -> None:
    if error is not None:
        _fail(error)


def attach(
    run_id: str,
    limits: Annotated[SupervisionParameters, Parameter(name="*")] | None = None,
    *,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    verbose: Verbose = False,
    json_output: JsonOption = False,
) -> None:
    """Supervise an existing backend run to its end. Never submits anything.

    Args:
        run_id: The backend's training run id.
    """
    output.use_json(json_output)
    try:
        check_id(run_id, "run_id")  # before Prefect or the backend is asked anything
    except InvalidParameters as error:
        _fail(error)
    _run_flow(
        ito_attach_training,
        {
            "run_id": run_id,
            "limits": limits or SupervisionParameters(),
            "credentials": command_credentials(credentials, api_url),
        },
        verbose,
    )


def _run_flow(
    flow: Flow[Any, Any],
    parameters: dict[str, Any],
    verbose: bool,
    *,
    confirmer: Callable[[], terminal.Confirmer | None] | None = None,
) -> None:
    """Run ``flow`` here and end with its outcome's exit code.

    ``confirmer`` is called once Prefect's API is ready (a booking block may need it) and before
    the flow starts; it returns who confirms the spend here, or ends the command first.
    """
    operator = terminal.ask_at_terminal if terminal.interactive() else terminal.leave_to_others

    with terminal.prefect_api():
        confirming = confirmer() if confirmer is not None else None

        async def run() -> Any:
            return await terminal.run_training(
                flow, parameters, operator, _console, confirmer=confirming, verbose=verbose
            )

        state = run_command(run())
    _report(state)


def _report(state: State[Any]) -> NoReturn:
    """End the command as its flow run ended: the summary, or the JSON document; its exit code."""
    code = exit_code(state)
    if output.json_mode():
        summary = views.final_summary(state)
        flow_run_id = state.state_details.flow_run_id
        data = {
            "flow_run_id": str(flow_run_id) if flow_run_id else None,
            "state_name": state.name,
            "state_message": state.message,
            "summary": summary,
        }
        output.emit(output.document(data=data, error=outcome_error(state), exit_code=code))
        sys.exit(int(code))
    try:
        if code is ExitCode.DETACHED:  # deliberate: one calm line, not an error and its tables
            views.print_detached(_console, state)
        else:
            views.print_outcome(_console, state)
            _print_backends()
    except OSError:  # the terminal went away: its flow run's state says so, and nobody reads this
        pass
    sys.exit(int(code))


def _print_backends() -> None:
    """Say where the answers came from: each backend the flow talked to, in this process."""
    for backend in provenance.seen():
        _console.print(backend.describe(), markup=False, highlight=False, soft_wrap=True)


def demo(
    *, scenario: str = "demo", verbose: Verbose = False, json_output: JsonOption = False
) -> None:
    """Run the real training flow end to end on the built-in reference simulator.

    Args:
        scenario: A built-in scenario: demo, gate-failure, refused, ladder-rejection,
            budget-exhausted, stall, two-spikes, unavailable.
    """
    from prefect_ito.cli.demo import run_demo

    output.use_json(json_output)
    try:
        state = run_demo(scenario, verbose=verbose)
    except ItoError as error:
        _fail(error)
    _report(state)


def _fail(error: ItoError) -> NoReturn:
    exit_with(error)
