"""The options ``train`` and ``quote`` share: a training request as the command line gives it.

Both commands take the same options — the fields of
:class:`~prefect_ito.parameters.TrainingParameters` (a booking by its id), ``--data-file``, and
where the backend is (``--api-url`` or ``--credentials``, see :mod:`prefect_ito.cli.target`) — so
``prefect-ito quote`` prices exactly what the same ``prefect-ito train`` would submit. They are
read and checked without Prefect (:mod:`prefect_ito.request_fields`): ``quote`` imports it only
when a saved block is named.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from cyclopts import Parameter
from pydantic import Field

from prefect_ito.backend.auth import resolve_api_url
from prefect_ito.backend.origins import admit
from prefect_ito.cli.errors import exit_with, run_command
from prefect_ito.contract import shown
from prefect_ito.exceptions import InvalidParameters, ItoError
from prefect_ito.request_fields import TrainingFields

if TYPE_CHECKING:
    from prefect_ito.blocks import ItoCredentials
    from prefect_ito.parameters import TrainingParameters

__all__ = [
    "CommandLineTraining",
    "DataFile",
    "Verbose",
    "backend_url",
    "command_credentials",
    "training_fields",
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

_Fields = TypeVar("_Fields", bound=TrainingFields[Any])


class CommandLineTraining(TrainingFields[str]):
    """The training parameters as the command line gives them: data may come from a file."""

    data: Annotated[list[str], Parameter(negative=())] = Field(
        default_factory=list,
        kw_only=True,
        description=TrainingFields.model_fields["data"].description,
    )


def training_fields(training: CommandLineTraining, data_file: Path | None) -> TrainingFields[str]:
    """Return the validated request: the options, with the data file's references added.

    Ends the command with the invalid-input code, naming the field, when a rule is broken.
    """
    return _with_data_file(TrainingFields[str], training, data_file)


def training_parameters(
    training: CommandLineTraining, data_file: Path | None
) -> TrainingParameters:
    """Return the flow's parameters: the options, with the data file's references added.

    Ends the command with the invalid-input code, naming the field, when a rule is broken.
    """
    from prefect_ito.parameters import TrainingParameters  # the flow's own type: Prefect

    return _with_data_file(TrainingParameters, training, data_file)


def _with_data_file(
    model: type[_Fields], training: CommandLineTraining, data_file: Path | None
) -> _Fields:
    fields = {name: getattr(training, name) for name in model.model_fields}
    refs = [*training.data, *(_read_refs(data_file) if data_file else [])]
    return run_command(_parse(model, {**fields, "data": refs}))


async def _parse(model: type[_Fields], fields: dict[str, Any]) -> _Fields:
    return model.parse(fields)


DATA_FILE_MAX_BYTES = 1024 * 1024
"""The most of a data file read: a request's references must fit in one request body, which a
backend may refuse past 1 MiB (the simulator's default limit)."""


def _read_refs(path: Path) -> list[str]:
    """Return the data references in ``path``: one a line; blank and # lines are skipped."""
    try:
        with path.open("rb") as file:
            # Never more than the limit: `/dev/zero` or a stray log must not fill the memory.
            raw = file.read(DATA_FILE_MAX_BYTES + 1)
        if len(raw) > DATA_FILE_MAX_BYTES:
            exit_with(
                InvalidParameters(
                    f"data_file: {shown(str(path))} is larger than {DATA_FILE_MAX_BYTES:,} "
                    "bytes: the data references must fit in one request"
                )
            )
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        exit_with(InvalidParameters(f"data_file: cannot read {shown(str(path))} ({reason})"))
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


def backend_url(name: str | None, api_url: str | None) -> str | None:
    """Return the backend URL ``--api-url`` or ``ITO_COMPUTE_API_URL`` gives, checked now.

    ``None`` when ``--credentials`` names a saved block instead: only Prefect can read it. The
    URL is checked as the flow checks its ``credentials`` parameter, origin included, so a
    command refuses at once what the flow would refuse later.
    """
    if name and api_url:
        exit_with(InvalidParameters("give --credentials or --api-url, not both"))
    if name:
        return None
    try:
        url = resolve_api_url(api_url)
    except ItoError as error:
        typed = InvalidParameters(f"api_url: not an http(s) URL ({api_url!r})")
        exit_with(typed if api_url else InvalidParameters(f"credentials: {error}"))
    try:
        admit(url, source="the credentials parameter")
    except ItoError as error:
        exit_with(error)
    return url


def command_credentials(name: str | None, api_url: str | None) -> ItoCredentials | str | None:
    """Return what the flow's ``credentials`` parameter gets; fail now if it names nothing."""
    backend_url(name, api_url)
    if not api_url:
        return name  # a block's name, or None: the flow reads ITO_COMPUTE_API_URL itself
    from prefect_ito.blocks import ItoCredentials  # the flow's parameter type: Prefect

    return ItoCredentials(api_url=api_url)
