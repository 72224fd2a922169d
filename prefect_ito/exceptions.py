"""Every error prefect-ito raises, in one tree rooted at :class:`ItoError`.

```
ItoError                  prefect-ito's own outcomes: SpendDeclined, NotConfirmed,
│                         AwaitingConfirmation, DeadlineExceeded, Detached, TerminalClosed,
│                         FlowRunNotFound, NothingToDecide, AnsweredByAnother,
│                         PrefectServerRequired, PrefectUnreachable
├── ItoTransportError     the request did not complete: ItoTimeoutError, ItoConnectionError
├── ItoProtocolError      the answer does not match contract v0
├── ItoAPIError           the backend answered with an error envelope: a class for each of its
│                         codes (Unauthenticated, BookingBusy, RateLimited, ConfirmationRequired…)
├── InvalidParameters     a parameter breaks a rule; nothing was sent: OriginNotAllowed
├── NotLoggedIn, TokenWithoutOrigin, NoUsableKeyring, InsecureKeyring     no token to send
└── ItoRunOutcome         a training run ended without success: GateFailed, RunRefused,
                          BudgetExhausted, RunStalled, RunCancelled, RunFailed, AwaitingDecision,
                          DecisionRequired
```

Each class is one row of the outcome table (:mod:`prefect_ito.outcomes`) and states that row's
stable upper-snake ``code``, Prefect ``state_name`` and ``exit_code`` (see :class:`ExitCode`).
The classes written out here are the few that are handled apart, or carry more than a message;
every other is made from its row by :func:`_outcome`, under the class that says how it is
handled, so that a caller still catches each outcome by name. A backend's code maps to its class
in one place, :func:`error_from_envelope`, read from the table's HTTP status column.

Messages are safe to show and log: they come from the backend's ``error.message`` (which the
contract declares safe), from prefect-ito itself, or from the outcome table, and never contain a
token.

One module past ~400 lines, as httpx keeps its own tree in one: a caller finds every class it
catches here, by name.
"""

from __future__ import annotations

import types
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from prefect_ito.contract import PendingAction, id_problem
from prefect_ito.outcomes import BY_NAME, OUTCOMES, ExitCode

# fmt: off
__all__ = [
    "AccessDenied", "ActionNotPending", "AnsweredByAnother", "AuthorizationDoesNotCover",
    "AuthorizationPending", "AwaitingConfirmation", "AwaitingDecision", "BackendUnavailable",
    "BookingBusy", "BookingNotEligible", "BookingNotFound", "BudgetExhausted",
    "CapabilityNotAvailable", "ClientReferenceInUse", "ConfirmationExpired", "ConfirmationMismatch",
    "ConfirmationRequired", "ConfirmationUsed", "ContractVersionUnsupported", "DeadlineExceeded",
    "DecisionConflict", "DecisionRequired", "Detached", "ExitCode", "ExpiredToken",
    "FlowRunNotFound", "GateFailed", "IdempotencyKeyInFlight", "IdempotencyKeyReused",
    "InsecureKeyring", "InsufficientScope", "InternalError", "InvalidParameters", "ItoAPIError",
    "ItoConnectionError", "ItoError", "ItoProtocolError", "ItoRunOutcome", "ItoTimeoutError",
    "ItoTransportError", "NoUsableKeyring", "NotConfirmed", "NotFound", "NotLoggedIn",
    "NothingToDecide",
    "OriginNotAllowed", "PayloadTooLarge", "PrefectServerRequired", "PrefectUnreachable",
    "QuoteAlreadyDecided", "QuoteNotFound", "RateLimited", "RunCancelled", "RunFailed",
    "RunNotFound", "RunRefused", "RunStalled", "SlowDown", "SpendAuthorizationNotFound",
    "SpendDeclined", "TerminalClosed", "TokenRevoked", "TokenWithoutOrigin", "Unauthenticated",
    "ValidationFailed",
    "check_id", "error_from_envelope", "invalid_parameters",
]
# fmt: on


def _restore(cls: type[ItoError], args: tuple[Any, ...], state: dict[str, Any]) -> ItoError:
    # Rebuild without calling the subclass's __init__, whose signature differs per class.
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


_CLASSES: dict[str, type[ItoError]] = {}
"""Each outcome's class, by code."""
_MESSAGES = {row.code: row.message for row in OUTCOMES}


def _state_its_row(cls: type[ItoError]) -> None:
    # Stated on the class itself, not inherited: its code, final state and exit code.
    row = BY_NAME[cls.__name__]
    cls.code, cls.state_name, cls.exit_code = row.code, row.state_name, row.exit_code
    if cls.__doc__ is None:
        cls.__doc__ = row.doc
    _CLASSES[row.code] = cls


class ItoError(Exception):
    """The root of every prefect-ito error.

    Each class states, beside its ``code``, what it means to Prefect and to a shell: the name of
    the Failed state a flow run ends in (``state_name``, so people and Automations tell outcomes
    apart) and the exit code of a ``prefect-ito`` command (``exit_code``), all from its row of the
    outcome table.

    Attributes:
        code: A stable, upper-snake identifier of the kind of error.
        state_name: The name of the final Prefect state this outcome ends a flow run in.
        exit_code: The exit code of a ``prefect-ito`` command that ends with it.
        message: A human message that is safe to show and log; the outcome's own when none is
            given.
    """

    code: str
    state_name: str
    exit_code: ExitCode

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:  # every class of this module is a row of the table
            _state_its_row(cls)

    def __init__(self, message: str | None = None) -> None:
        if message is None:
            message = _MESSAGES.get(self.code, _MESSAGES[ItoError.code])
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Prefect pickles exceptions into failed states; keep every attribute across that trip.
        return (_restore, (type(self), self.args, self.__dict__))


_state_its_row(ItoError)

E = TypeVar("E", bound=ItoError)


def _outcome(name: str, base: type[E]) -> type[E]:
    """Return the class of the outcome ``name``: ``base``, handled as it is, stating its row."""

    def body(namespace: dict[str, Any]) -> None:
        namespace["__module__"] = __name__

    return cast(type[E], types.new_class(name, (base,), exec_body=body))


# --- transport and protocol -----------------------------------------------------------------------


class ItoTransportError(ItoError):
    """The request did not complete: nothing, or not all of the answer, came back.

    Attributes:
        ambiguous: True when the request may have reached the backend (the answer was lost),
            False when it surely did not (the connection was never made).
    """

    def __init__(self, message: str | None = None, *, ambiguous: bool = True) -> None:
        super().__init__(message)
        self.ambiguous = ambiguous


ItoTimeoutError = _outcome("ItoTimeoutError", ItoTransportError)
ItoConnectionError = _outcome("ItoConnectionError", ItoTransportError)


class ItoProtocolError(ItoError):
    """The backend answered, but not in the shape contract v0 defines.

    Attributes:
        endpoint: The endpoint that answered, e.g. ``GET /v0/training-runs/{run_id}``.
        field: The dotted path of the offending field, or None when the body as a whole is bad.
    """

    def __init__(self, message: str, *, endpoint: str, field: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.field = field


# --- API errors -----------------------------------------------------------------------------------


class ItoAPIError(ItoError):
    """The backend answered with an error envelope.

    Each code of :class:`~prefect_ito.contract.ErrorCode` is a subclass stating it; an unknown
    code is raised as this class itself, with ``code`` set to what the backend said.

    Attributes:
        status_code: The HTTP status, or None when the error was raised without a response.
        request_id: The backend's ``X-Request-Id``, if it sent one.
        field: The offending request field, if the backend named one.
        retry_after: Seconds the backend asked to wait (``Retry-After``), if it said.
        details: The envelope's ``error.details``: facts about the error, by code (e.g.
            ``reason`` for ``AUTHORIZATION_DOES_NOT_COVER``); empty when it sent none.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        status_code: int | None = None,
        request_id: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.status_code = status_code
        self.request_id = request_id
        self.field = field
        self.retry_after = retry_after
        self.details = details or {}

    def __str__(self) -> str:
        prefix = f"[{self.code}] "
        if self.request_id:
            prefix = f"[{self.code} request {self.request_id}] "
        return prefix + self.message


Unauthenticated = _outcome("Unauthenticated", ItoAPIError)
TokenRevoked = _outcome("TokenRevoked", ItoAPIError)
InsufficientScope = _outcome("InsufficientScope", ItoAPIError)
ValidationFailed = _outcome("ValidationFailed", ItoAPIError)
NotFound = _outcome("NotFound", ItoAPIError)
BookingNotFound = _outcome("BookingNotFound", ItoAPIError)
BookingNotEligible = _outcome("BookingNotEligible", ItoAPIError)
CapabilityNotAvailable = _outcome("CapabilityNotAvailable", ItoAPIError)
IdempotencyKeyReused = _outcome("IdempotencyKeyReused", ItoAPIError)
IdempotencyKeyInFlight = _outcome("IdempotencyKeyInFlight", ItoAPIError)
BookingBusy = _outcome("BookingBusy", ItoAPIError)
ClientReferenceInUse = _outcome("ClientReferenceInUse", ItoAPIError)
RunNotFound = _outcome("RunNotFound", ItoAPIError)
ActionNotPending = _outcome("ActionNotPending", ItoAPIError)
DecisionConflict = _outcome("DecisionConflict", ItoAPIError)
RateLimited = _outcome("RateLimited", ItoAPIError)
BackendUnavailable = _outcome("BackendUnavailable", ItoAPIError)
AuthorizationPending = _outcome("AuthorizationPending", ItoAPIError)
SlowDown = _outcome("SlowDown", ItoAPIError)
AccessDenied = _outcome("AccessDenied", ItoAPIError)
ExpiredToken = _outcome("ExpiredToken", ItoAPIError)
InternalError = _outcome("InternalError", ItoAPIError)
ConfirmationRequired = _outcome("ConfirmationRequired", ItoAPIError)
ConfirmationMismatch = _outcome("ConfirmationMismatch", ItoAPIError)
ConfirmationExpired = _outcome("ConfirmationExpired", ItoAPIError)
ConfirmationUsed = _outcome("ConfirmationUsed", ItoAPIError)
PayloadTooLarge = _outcome("PayloadTooLarge", ItoAPIError)
QuoteNotFound = _outcome("QuoteNotFound", ItoAPIError)
QuoteAlreadyDecided = _outcome("QuoteAlreadyDecided", ItoAPIError)
AuthorizationDoesNotCover = _outcome("AuthorizationDoesNotCover", ItoAPIError)
ContractVersionUnsupported = _outcome("ContractVersionUnsupported", ItoAPIError)
SpendAuthorizationNotFound = _outcome("SpendAuthorizationNotFound", ItoAPIError)

_API_ERRORS: dict[str, type[ItoAPIError]] = {
    row.code: cls
    for row in OUTCOMES
    if row.status is not None and issubclass(cls := _CLASSES[row.code], ItoAPIError)
}
"""The class of each code a backend answers with: each row of the table with an HTTP status."""


def error_from_envelope(
    code: str,
    message: str,
    *,
    status_code: int | None = None,
    request_id: str | None = None,
    field: str | None = None,
    retry_after: float | None = None,
    details: dict[str, Any] | None = None,
) -> ItoAPIError:
    """Return the error for an envelope's ``error.code``: the one place codes map to classes.

    Args:
        code: The envelope's ``error.code``.
        message: The envelope's ``error.message`` (safe by contract).
        status_code: The HTTP status of the answer.
        request_id: The backend's request id, if any.
        field: The envelope's ``error.field``, if any.
        retry_after: The parsed ``Retry-After``, if the answer had one.
        details: The envelope's ``error.details``, if any.

    Returns:
        An instance of the matching subclass, or of :class:`ItoAPIError` for an unknown code.
    """
    common: dict[str, Any] = {
        "status_code": status_code,
        "request_id": request_id,
        "field": field,
        "retry_after": retry_after,
        "details": details,
    }
    cls = _API_ERRORS.get(code)
    if cls is None:
        return ItoAPIError(message, code=code, **common)
    return cls(message, **common)


# --- local conditions -----------------------------------------------------------------------------


class NotLoggedIn(ItoError):
    """No token was found in the environment or the keyring.

    ``reason`` says why the keyring was not consulted, when it could not be used.
    """

    def __init__(
        self, message: str | None = None, *, api_url: str | None = None, reason: str | None = None
    ) -> None:
        target = api_url or "URL"
        why = f"the keyring was not used: {reason}" if reason else None
        if message:
            super().__init__(f"{message} ({why})" if why else message)
            return
        why = why or "no Itô token in ITO_COMPUTE_TOKEN or the keyring"
        super().__init__(
            f"not logged in to {target} ({why}): run `prefect-ito login --api-url {target}`, "
            "or set ITO_COMPUTE_TOKEN and ITO_COMPUTE_API_URL in the worker's own environment"
        )


class InvalidParameters(ItoError, ValueError):
    """A flow, job or command parameter breaks a rule; nothing was sent to the backend.

    Attributes:
        field: The parameter that breaks the rule, when it is one parameter.
    """

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OriginNotAllowed(InvalidParameters):
    """A backend URL read from Prefect names an origin this process is not configured for.

    Nothing was sent to it. The operator allows an origin with ``ITO_COMPUTE_ALLOWED_ORIGINS`` in
    the worker's and the watcher's own environment (see :mod:`prefect_ito.backend.origins`).

    Attributes:
        origin: The origin that was refused.
    """

    def __init__(self, message: str, *, origin: str) -> None:
        super().__init__(message, field="api_url")
        self.origin = origin


class NoUsableKeyring(ItoError):
    """No keyring a token can be kept in: none is available, or it cannot be read or written.

    Attributes:
        reason: Why, in a few words (the message also says what to do instead).
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


InsecureKeyring = _outcome("InsecureKeyring", NoUsableKeyring)
TokenWithoutOrigin = _outcome("TokenWithoutOrigin", ItoError)
SpendDeclined = _outcome("SpendDeclined", ItoError)
NotConfirmed = _outcome("NotConfirmed", ItoError)
AwaitingConfirmation = _outcome("AwaitingConfirmation", ItoError)
DeadlineExceeded = _outcome("DeadlineExceeded", ItoError)
Detached = _outcome("Detached", ItoError)
TerminalClosed = _outcome("TerminalClosed", ItoError)
FlowRunNotFound = _outcome("FlowRunNotFound", ItoError)
NothingToDecide = _outcome("NothingToDecide", ItoError)
AnsweredByAnother = _outcome("AnsweredByAnother", ItoError)
PrefectServerRequired = _outcome("PrefectServerRequired", ItoError)
PrefectUnreachable = _outcome("PrefectUnreachable", ItoError)


# --- run outcomes ---------------------------------------------------------------------------------


class ItoRunOutcome(ItoError):
    """A training run ended, or stopped, without success.

    Attributes:
        run_id: The backend's run id, when known.
    """

    def __init__(self, message: str | None = None, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


RunRefused = _outcome("RunRefused", ItoRunOutcome)
BudgetExhausted = _outcome("BudgetExhausted", ItoRunOutcome)
RunStalled = _outcome("RunStalled", ItoRunOutcome)
RunCancelled = _outcome("RunCancelled", ItoRunOutcome)
RunFailed = _outcome("RunFailed", ItoRunOutcome)
AwaitingDecision = _outcome("AwaitingDecision", ItoRunOutcome)


class GateFailed(ItoRunOutcome):
    """A stage's eval gate failed, which stops the run.

    Attributes:
        stage: The stage whose gate failed.
        eval_name: The eval that missed its threshold.
        score: The score it reached.
        threshold: The threshold it had to meet.
    """

    def __init__(
        self,
        stage: str,
        eval_name: str,
        score: float,
        threshold: float,
        *,
        run_id: str | None = None,
        message: str | None = None,
    ) -> None:
        super().__init__(
            message
            or f"gate failed at stage {stage}: {eval_name} scored {score:g} "
            f"against a threshold of {threshold:g}",
            run_id=run_id,
        )
        self.stage = stage
        self.eval_name = eval_name
        self.score = score
        self.threshold = threshold


class DecisionRequired(ItoRunOutcome):
    """The run needs a person to decide on a pending action.

    Attributes:
        action: The pending action the backend is holding the run for.
    """

    def __init__(
        self,
        action: PendingAction,
        *,
        run_id: str | None = None,
        message: str | None = None,
    ) -> None:
        super().__init__(
            message
            or f"{action.kind} at stage {action.stage} step {action.step} needs a decision "
            f"(action {action.action_id})",
            run_id=run_id,
        )
        self.action = action


def invalid_parameters(error: ValidationError) -> InvalidParameters:
    """Return the first broken rule of ``error`` as :class:`InvalidParameters` naming the field."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    cause = (first.get("ctx") or {}).get("error")
    message = str(cause) if isinstance(cause, ValueError) else first["msg"]
    if first["type"] == "missing":
        message = "is required"
    elif first["type"] == "extra_forbidden":
        message = "is not a parameter of ito-training"
    # A rule over several fields names them in its own message.
    if not field:
        return InvalidParameters(message)
    return InvalidParameters(f"{field}: {message}", field=field)


def check_id(value: str, field: str) -> str:
    """Return ``value``, a booking, run or action id to send; refuse it before any request.

    An id is 1 to 128 characters, without surrounding spaces or control characters, and never
    changes the path of the request it goes into (see :func:`prefect_ito.contract.id_problem`).

    Raises:
        InvalidParameters: naming ``field`` and the rule ``value`` breaks.
    """
    problem = id_problem(value) if isinstance(value, str) else "must be a string"
    if problem is not None:
        raise InvalidParameters(f"{field}: {problem}", field=field)
    return value
