"""The options ``train`` and ``quote`` share: a training request as the command line gives it.

Both commands take the same options — the fields of
:class:`~prefect_ito.parameters.TrainingParameters`, ``--data-file``, and where the backend is
(``--api-url`` or ``--credentials``, see :mod:`prefect_ito.cli.target`) — so ``prefect-ito quote``
prices exactly what the same ``prefect-ito train`` would submit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter
from pydantic import Field

from prefect_ito.blocks import ItoCredentials, resolve_credentials
from prefect_ito.cli.errors import exit_with, run_command
from prefect_ito.exceptions import InvalidParameters, ItoError
from prefect_ito.parameters import TrainingParameters

__all__ = [
    "CommandLineTraining",
    "DataFile",
    "Verbose",
    "command_credentials",
    "training_parameters",
]

DataFile = Annotated[
    Path | None,
    Parameter(
        help="A file of data references, one a line (blank lines and lines starting with # are "
        "skipped); added to any --data. Use it for more than a few hundred references."
    ),
]
Verbose = Annotated[
    bool,
    Parameter(help="Also show Prefect's line for every task run that finished."),
]


class CommandLineTraining(TrainingParameters):
    """The training parameters as the command line gives them: data may come from a file."""

    data: Annotated[list[str], Parameter(negative=())] = Field(
        default_factory=list,
        kw_only=True,
        description=TrainingParameters.model_fields["data"].description,
    )


def training_parameters(
    training: CommandLineTraining, data_file: Path | None
) -> TrainingParameters:
    """Return the validated parameters: the options, with the data file's references added.

    Ends the command with the invalid-input code, naming the field, when a rule is broken.
    """
    fields = {name: getattr(training, name) for name in TrainingParameters.model_fields}
    refs = [*training.data, *(_read_refs(data_file) if data_file else [])]
    return run_command(_parse({**fields, "data": refs}))


async def _parse(fields: dict[str, Any]) -> TrainingParameters:
    return TrainingParameters.parse(fields)


def _read_refs(path: Path) -> list[str]:
    """Return the data references in ``path``: one a line; blank and # lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        exit_with(InvalidParameters(f"data_file: cannot read {str(path)!r} ({reason})"))
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


def command_credentials(name: str | None, api_url: str | None) -> ItoCredentials | str | None:
    """Return what the flow's ``credentials`` parameter gets; fail now if it names nothing."""
    if name and api_url:
        exit_with(InvalidParameters("give --credentials or --api-url, not both"))
    if api_url:
        try:
            return ItoCredentials(api_url=api_url)
        except (ItoError, ValueError):
            exit_with(InvalidParameters(f"api_url: not an http(s) URL ({api_url!r})"))
    if name is None:
        run_command(resolve_credentials(None))  # ITO_COMPUTE_API_URL must say where, then
    return name
