"""What a ``prefect-ito`` command prints as its result: human text, or one JSON document.

With ``--json`` a command prints exactly one JSON document on standard output, in the shape of
the contract's envelope (:class:`~prefect_ito.contract.Envelope` and
:class:`~prefect_ito.contract.ErrorEnvelope`)::

    {"ok": true,  "live_api_contacted": false, "notice": "…", "data": {…}}
    {"ok": false, "live_api_contacted": null,  "notice": null,
     "error": {"code": "NOT_LOGGED_IN", "message": "…", "exit_code": 6}}

It differs from the contract's envelope in three ways, each because a command is not one backend
answer: ``live_api_contacted`` and ``notice`` are null when no backend answered (a command that
reads only Prefect, or one that failed before asking); ``error.code`` is any prefect-ito error
code (the backend's codes pass through unchanged) and ``error`` carries the command's
``exit_code`` (and the offending ``field`` or the backend's ``request_id`` when known); and a
command whose flow run ended without success (``train``, ``attach``, ``demo``) keeps its
``data`` beside the ``error``, since the run summary is what a caller needs next (to attach
again, or to read the failed gate).

Everything else — progress, logs, prompts, Prefect's own output, even that of the processes the
command starts — goes to standard error: JSON mode points file descriptor 1 at standard error
and keeps a private copy of the real standard output for the document alone. The exit code is
the same with and without ``--json``.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, TypeVar

from cyclopts import Parameter
from pydantic_core import to_json

from prefect_ito.backend import provenance
from prefect_ito.exceptions import ExitCode, ItoError

__all__ = [
    "JSON_FLAG",
    "JsonOption",
    "document",
    "emit",
    "emit_unexpected",
    "fail",
    "forget",
    "json_mode",
    "use_json",
]

T = TypeVar("T")

JSON_FLAG = "--json"
JsonOption = Annotated[
    bool,
    Parameter(
        name=JSON_FLAG,
        negative=(),
        help="Print one JSON document on standard output (ok, live_api_contacted, notice, then "
        "data or error); progress, logs and prompts go to standard error.",
    ),
]
"""The ``--json`` option; a command that declares it passes it to
:func:`prefect_ito.cli.errors.respond`."""

_document_fd: int | None = None
_emitted = False


def use_json(enabled: bool = True) -> None:
    """Turn JSON mode on (once; turning it on again or off later changes nothing).

    From here on, whatever writes to standard output — Python, Rich, Prefect, child processes —
    writes to standard error, and only :func:`emit` writes to the real standard output.
    """
    global _document_fd
    if not enabled or _document_fd is not None:
        return
    sys.stdout.flush()
    _document_fd = os.dup(1)
    os.dup2(2, 1)


def forget() -> None:
    """Forget JSON mode and the document emitted, for a command run again in the same process
    (the CLI's tests do so); standard output stays where it is now."""
    global _document_fd, _emitted
    if _document_fd is not None:
        os.close(_document_fd)
    _document_fd, _emitted = None, False


def json_mode() -> bool:
    """Tell whether this command answers with a JSON document."""
    return _document_fd is not None


def document(
    *, data: Any = None, error: ItoError | None = None, exit_code: int | None = None
) -> dict[str, Any]:
    """Return the JSON document of a command's result, or of its failure.

    Args:
        data: The result (pydantic models, lists and dicts of them); kept beside an ``error``
            only when given.
        error: Why the command failed; None when it succeeded.
        exit_code: The exit code, when it is not the error's own (a flow run's final state).
    """
    live, notice = _provenance()
    body: dict[str, Any] = {"ok": error is None, "live_api_contacted": live, "notice": notice}
    if error is None or data is not None:
        body["data"] = data
    if error is not None:
        body["error"] = _error(error, exit_code)
    return body


def _error(error: ItoError, exit_code: int | None) -> dict[str, Any]:
    described: dict[str, Any] = {
        "code": error.code,
        "message": getattr(error, "message", None) or str(error),
        "exit_code": int(error.exit_code if exit_code is None else exit_code),
    }
    for extra in ("field", "request_id"):
        value = getattr(error, extra, None)
        if value is not None:
            described[extra] = value
    return described


def _provenance() -> tuple[bool | None, str | None]:
    """Return what the backends this process asked said of their answers; nulls if none did.

    A command asks one backend; should it have asked several, the answers count as live only
    when every one was.
    """
    seen = provenance.seen()
    if not seen:
        return None, None
    notices = dict.fromkeys(p.notice for p in seen if p.notice)
    return all(p.live_api_contacted for p in seen), " ".join(notices) or None


def emit(body: dict[str, Any]) -> None:
    """Write ``body`` as the one JSON document on standard output; later calls write nothing."""
    global _emitted
    if _document_fd is None or _emitted:
        return
    _emitted = True
    sys.stdout.flush()  # what was printed before goes out before the document (to stderr)
    # A score the backend never sent (NaN) is null: strict JSON has no NaN.
    data = to_json(body, inf_nan_mode="null") + b"\n"
    while data:
        data = data[os.write(_document_fd, data) :]


def fail(error: ItoError) -> bool:
    """Emit ``error``'s document if this command answers in JSON; tell whether it did."""
    if not json_mode():
        return False
    emit(document(error=error))
    return True


def emit_unexpected(error: BaseException) -> None:
    """Emit the document of a failure prefect-ito did not expect (its traceback goes to stderr).

    The exception's text is not repeated in the document: an unexpected failure's text was
    never checked to be safe to show.
    """
    unexpected = ItoError(f"unexpected {type(error).__name__}; see standard error")
    unexpected.code, unexpected.exit_code = "UNEXPECTED_ERROR", ExitCode.ERROR
    emit(document(error=unexpected))
