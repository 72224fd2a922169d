"""Every error prefect-ito raises, in one tree rooted at :class:`ItoError`.

```
ItoError
├── ItoTransportError                 the request did not complete
│   ├── ItoTimeoutError
│   └── ItoConnectionError
├── ItoProtocolError                  the answer does not match contract v0
├── ItoAPIError                       the backend answered with an error envelope
│   ├── Unauthenticated, TokenRevoked                          (401)
│   ├── InsufficientScope, AuthorizationDoesNotCover           (403)
│   ├── ValidationFailed                                       (422)
│   ├── NotFound, BookingNotFound, RunNotFound,
│   │   QuoteNotFound, SpendAuthorizationNotFound              (404)
│   ├── BookingNotEligible, IdempotencyKeyReused, BookingBusy,
│   │   ActionNotPending, DecisionConflict, ClientReferenceInUse,
│   │   IdempotencyKeyInFlight (retried)                       (409)
│   ├── ConfirmationRequired                                   (428)
│   ├── ConfirmationMismatch, ConfirmationUsed,
│   │   QuoteAlreadyDecided                                    (409)
│   ├── ConfirmationExpired                                    (410)
│   ├── ContractVersionUnsupported                             (400)
│   ├── PayloadTooLarge                                        (413)
│   ├── CapabilityNotAvailable                                 (501)
│   ├── RateLimited                                            (429)
│   ├── BackendUnavailable                                     (503)
│   ├── InternalError                                          (500)
│   └── AuthorizationPending, SlowDown, AccessDenied, ExpiredToken   (device login)
├── InvalidParameters                 a parameter breaks a rule; nothing was sent
│   └── OriginNotAllowed              a URL from Prefect names a backend not configured here
├── SpendDeclined                     a person declined the spend; nothing was submitted
├── AwaitingConfirmation              nobody confirmed the spend in time; nothing was submitted
├── DeadlineExceeded                  supervision reached its deadline
├── Detached                          the person at the terminal detached; the run goes on
├── FlowRunNotFound, NothingToDecide  the Prefect flow run named is unknown, or not paused
├── AnsweredByAnother                 another answer to the same question was taken first
├── PrefectServerRequired, PrefectUnreachable
├── NotLoggedIn                       no token was found
├── TokenWithoutOrigin                ITO_COMPUTE_TOKEN is set without ITO_COMPUTE_API_URL
├── NoUsableKeyring                   no keyring a token can be kept in (none, or a refused one)
│   └── InsecureKeyring               the keyring backend keeps secrets in plain text
└── ItoRunOutcome                     a training run ended without success
    ├── GateFailed, RunRefused, BudgetExhausted, RunStalled,
    │   RunCancelled, RunFailed
    └── AwaitingDecision, DecisionRequired
```

Every error has a stable upper-snake ``code``, the ``state_name`` of the Prefect state it ends a
flow run in, and the ``exit_code`` of a command that ends with it (see :class:`ExitCode`): the one
table of outcomes, which ``docs/flows.md`` reproduces and a test checks. Messages are safe to show
and log: they come from the backend's ``error.message`` (which the contract declares safe) or from
prefect-ito itself, and never contain a token.

The tree is one module, as httpx keeps its own: it is read as a whole, and past ~400 lines only
because every class carries its three stable attributes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from pydantic import ValidationError

from prefect_ito.contract import ErrorCode, PendingAction, id_problem

__all__ = [
    "AccessDenied",
    "ActionNotPending",
    "AnsweredByAnother",
    "AuthorizationDoesNotCover",
    "AuthorizationPending",
    "AwaitingConfirmation",
    "AwaitingDecision",
    "BackendUnavailable",
    "BookingBusy",
    "BookingNotEligible",
    "BookingNotFound",
    "BudgetExhausted",
    "CapabilityNotAvailable",
    "ClientReferenceInUse",
    "ConfirmationExpired",
    "ConfirmationMismatch",
    "ConfirmationRequired",
    "ConfirmationUsed",
    "ContractVersionUnsupported",
    "DeadlineExceeded",
    "DecisionConflict",
    "DecisionRequired",
    "Detached",
    "ExitCode",
    "ExpiredToken",
    "FlowRunNotFound",
    "GateFailed",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyReused",
    "InsecureKeyring",
    "InsufficientScope",
    "InternalError",
    "InvalidParameters",
    "ItoAPIError",
    "ItoConnectionError",
    "ItoError",
    "ItoProtocolError",
    "ItoRunOutcome",
    "ItoTimeoutError",
    "ItoTransportError",
    "NoUsableKeyring",
    "NotFound",
    "NotLoggedIn",
    "NothingToDecide",
    "OriginNotAllowed",
    "PayloadTooLarge",
    "PrefectServerRequired",
    "PrefectUnreachable",
    "QuoteAlreadyDecided",
    "QuoteNotFound",
    "RateLimited",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "RunRefused",
    "RunStalled",
    "SlowDown",
    "SpendAuthorizationNotFound",
    "SpendDeclined",
    "TokenRevoked",
    "TokenWithoutOrigin",
    "Unauthenticated",
    "ValidationFailed",
    "check_id",
    "error_from_envelope",
    "invalid_parameters",
]


def _restore(cls: type[ItoError], args: tuple[Any, ...], state: dict[str, Any]) -> ItoError:
    # Rebuild without calling the subclass's __init__, whose signature differs per class.
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ExitCode(IntEnum):
    """The exit code of every ``prefect-ito`` command, one per kind of outcome."""

    SUCCESS = 0
    ERROR = 1
    INVALID_INPUT = 2
    UNAVAILABLE = 3
    BOOKING = 4
    RUN_OUTCOME = 5
    AUTHENTICATION = 6
    AWAITING_DECISION = 7
    CANCELLED = 8
    NOT_FOUND = 9
    NOT_CONFIRMED = 10
    DECLINED = 11
    FORBIDDEN = 12
    """Authenticated, but the token may not do this (it lacks a scope)."""
    ANSWERED_BY_ANOTHER = 13
    """Another answer to the same question was taken first; this one was not."""
    DETACHED = 130


class ItoError(Exception):
    """The root of every prefect-ito error.

    Each class states, beside its ``code``, what it means to Prefect and to a shell: the name of
    the Failed state a flow run ends in (``state_name``, so people and Automations tell outcomes
    apart) and the exit code of a ``prefect-ito`` command (``exit_code``).

    Attributes:
        code: A stable, upper-snake identifier of the kind of error.
        state_name: The name of the final Prefect state this outcome ends a flow run in.
        exit_code: The exit code of a ``prefect-ito`` command that ends with it.
        message: A human message that is safe to show and log.
    """

    code: str = "ITO_ERROR"
    state_name: str = "Failed"
    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Prefect pickles exceptions into failed states; keep every attribute across that trip.
        return (_restore, (type(self), self.args, self.__dict__))


# --- transport ------------------------------------------------------------------------------------


class ItoTransportError(ItoError):
    """The request did not complete: nothing, or not all of the answer, came back.

    Attributes:
        ambiguous: True when the request may have reached the backend (the answer was lost),
            False when it surely did not (the connection was never made).
    """

    code = "TRANSPORT_ERROR"
    state_name = "BackendUnreachable"
    exit_code = ExitCode.ERROR

    def __init__(self, message: str, *, ambiguous: bool = True) -> None:
        super().__init__(message)
        self.ambiguous = ambiguous


class ItoTimeoutError(ItoTransportError):
    """A connect, read, write or pool timeout ran out."""

    code = "TIMEOUT"
    state_name = "BackendUnreachable"
    exit_code = ExitCode.ERROR


class ItoConnectionError(ItoTransportError):
    """The connection failed or was dropped."""

    code = "CONNECTION_ERROR"
    state_name = "BackendUnreachable"
    exit_code = ExitCode.ERROR


class ItoProtocolError(ItoError):
    """The backend answered, but not in the shape contract v0 defines.

    Attributes:
        endpoint: The endpoint that answered, e.g. ``GET /v0/training-runs/{run_id}``.
        field: The dotted path of the offending field, or None when the body as a whole is bad.
    """

    code = "PROTOCOL_ERROR"
    state_name = "ProtocolError"
    exit_code = ExitCode.ERROR

    def __init__(self, message: str, *, endpoint: str, field: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.field = field


# --- API errors -----------------------------------------------------------------------------------


class ItoAPIError(ItoError):
    """The backend answered with an error envelope.

    Subclasses pin ``code`` to one :class:`~prefect_ito.contract.ErrorCode`; an unknown code is
    raised as this class itself, with ``code`` set to what the backend said.

    Attributes:
        status_code: The HTTP status, or None when the error was raised without a response.
        request_id: The backend's ``X-Request-Id``, if it sent one.
        field: The offending request field, if the backend named one.
    """

    code = "API_ERROR"
    state_name = "BackendError"
    exit_code = ExitCode.ERROR

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int | None = None,
        request_id: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.status_code = status_code
        self.request_id = request_id
        self.field = field

    def __str__(self) -> str:
        prefix = f"[{self.code}] "
        if self.request_id:
            prefix = f"[{self.code} request {self.request_id}] "
        return prefix + self.message


class Unauthenticated(ItoAPIError):
    """No valid bearer token: log in again with ``prefect-ito login``."""

    code = ErrorCode.UNAUTHENTICATED.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class TokenRevoked(ItoAPIError):
    """The bearer token was revoked; work stops and no login is started by itself."""

    code = ErrorCode.TOKEN_REVOKED.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class InsufficientScope(ItoAPIError):
    """The token is valid but lacks the scope this call needs: final, never retried.

    A person with the right to do it must act, or log in with a token that carries the scope;
    nothing is asked again by itself.
    """

    code = ErrorCode.INSUFFICIENT_SCOPE.value
    state_name = "InsufficientScope"
    exit_code = ExitCode.FORBIDDEN


class ValidationFailed(ItoAPIError):
    """The backend rejected the request body or parameters."""

    code = ErrorCode.VALIDATION_ERROR.value
    state_name = "InvalidParameters"
    exit_code = ExitCode.INVALID_INPUT


class NotFound(ItoAPIError):
    """No such resource."""

    code = ErrorCode.NOT_FOUND.value
    state_name = "NotFound"
    exit_code = ExitCode.NOT_FOUND


class BookingNotFound(ItoAPIError):
    """The backend knows no such booking."""

    code = ErrorCode.BOOKING_NOT_FOUND.value
    state_name = "BookingNotEligible"
    exit_code = ExitCode.BOOKING


class BookingNotEligible(ItoAPIError):
    """The booking exists but may not train (pending, expired, revoked or released)."""

    code = ErrorCode.BOOKING_NOT_ELIGIBLE.value
    state_name = "BookingNotEligible"
    exit_code = ExitCode.BOOKING


class CapabilityNotAvailable(ItoAPIError):
    """The backend does not offer this capability (yet), e.g. ``training_run``."""

    code = ErrorCode.CAPABILITY_NOT_AVAILABLE.value
    state_name = "Unavailable"
    exit_code = ExitCode.UNAVAILABLE


class IdempotencyKeyReused(ItoAPIError):
    """The idempotency key was already used with a different request: final, never retried."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED.value
    state_name = "IdempotencyKeyReused"
    exit_code = ExitCode.INVALID_INPUT


class IdempotencyKeyInFlight(ItoAPIError):
    """A request with this idempotency key is still being processed at the backend.

    The one 409 the client retries: after ``Retry-After``, the same request with the same key.
    Raised only once its retries ran out.

    Attributes:
        retry_after: Seconds the backend asked to wait, if it said.
    """

    code = ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT.value
    state_name = "BackendUnavailable"
    exit_code = ExitCode.ERROR

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class BookingBusy(ItoAPIError):
    """The booking already has an unfinished run with a different manifest."""

    code = ErrorCode.BOOKING_BUSY.value
    state_name = "BookingBusy"
    exit_code = ExitCode.BOOKING


class ClientReferenceInUse(ItoAPIError):
    """The client reference is already on another run of the account: final, never retried.

    prefect-ito's reference is the flow run's id, so the flow run has made its run before; it
    re-attaches to that run rather than make another, and ends with this only when that run is
    for a different request.
    """

    code = ErrorCode.CLIENT_REFERENCE_IN_USE.value
    state_name = "ClientReferenceInUse"
    exit_code = ExitCode.INVALID_INPUT


class RunNotFound(ItoAPIError):
    """The backend knows no such training run."""

    code = ErrorCode.RUN_NOT_FOUND.value
    state_name = "NotFound"
    exit_code = ExitCode.NOT_FOUND


class ActionNotPending(ItoAPIError):
    """The action was not (or no longer) waiting for a decision."""

    code = ErrorCode.ACTION_NOT_PENDING.value
    state_name = "DecisionNotRelayed"
    exit_code = ExitCode.ERROR


class DecisionConflict(ItoAPIError):
    """A different decision was already recorded for this action: final, never retried."""

    code = ErrorCode.DECISION_CONFLICT.value
    state_name = "DecisionNotRelayed"
    exit_code = ExitCode.ERROR


class RateLimited(ItoAPIError):
    """Too many requests.

    Attributes:
        retry_after: Seconds the backend asked to wait, if it said.
    """

    code = ErrorCode.RATE_LIMITED.value
    state_name = "BackendUnavailable"
    exit_code = ExitCode.ERROR

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class BackendUnavailable(ItoAPIError):
    """The backend is temporarily unavailable."""

    code = ErrorCode.BACKEND_UNAVAILABLE.value
    state_name = "BackendUnavailable"
    exit_code = ExitCode.ERROR


class AuthorizationPending(ItoAPIError):
    """Device login: the user has not approved yet; keep polling."""

    code = ErrorCode.AUTHORIZATION_PENDING.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class SlowDown(ItoAPIError):
    """Device login: polling too fast; add five seconds to the interval."""

    code = ErrorCode.SLOW_DOWN.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class AccessDenied(ItoAPIError):
    """Device login: the user refused."""

    code = ErrorCode.ACCESS_DENIED.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class ExpiredToken(ItoAPIError):
    """Device login: the device code expired before it was approved."""

    code = ErrorCode.EXPIRED_TOKEN.value
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class InternalError(ItoAPIError):
    """The backend failed unexpectedly."""

    code = ErrorCode.INTERNAL_ERROR.value
    state_name = "BackendError"
    exit_code = ExitCode.ERROR


class ConfirmationRequired(ItoAPIError):
    """Nobody confirmed the spend: a new run needs a person's confirmation of a quote.

    Raised by the backend for a submission without one, and by prefect-ito itself before
    anything is sent when nobody could confirm (no terminal, no ``--confirm``, no standing
    authorization that covers the request).
    """

    code = ErrorCode.CONFIRMATION_REQUIRED.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class ConfirmationMismatch(ItoAPIError):
    """The confirmation is for another request: another quote, booking, manifest or budget."""

    code = ErrorCode.CONFIRMATION_MISMATCH.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class ConfirmationExpired(ItoAPIError):
    """The confirmed quote expired before the submission reached the backend."""

    code = ErrorCode.CONFIRMATION_EXPIRED.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class ConfirmationUsed(ItoAPIError):
    """The confirmed quote already made another run: one confirmation, one run."""

    code = ErrorCode.CONFIRMATION_USED.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class PayloadTooLarge(ItoAPIError):
    """The request body is larger than the backend reads: final, never retried.

    Nothing was done with it. The backend names its limit in the message.
    """

    code = ErrorCode.PAYLOAD_TOO_LARGE.value
    state_name = "InvalidParameters"
    exit_code = ExitCode.INVALID_INPUT


class QuoteNotFound(ItoAPIError):
    """The backend knows no such quote for this account (contract v0.4)."""

    code = ErrorCode.QUOTE_NOT_FOUND.value
    state_name = "NotFound"
    exit_code = ExitCode.NOT_FOUND


class QuoteAlreadyDecided(ItoAPIError):
    """The quote was already answered the other way, or by another person: final (v0.4).

    ``details.state`` and ``details.principal`` of the answer say how and by whom.
    """

    code = ErrorCode.QUOTE_ALREADY_DECIDED.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class AuthorizationDoesNotCover(ItoAPIError):
    """The named standing authorization does not cover the quote now (contract v0.4).

    The backend says why (``details.reason``); nothing was created, and a person may still
    confirm the quote.
    """

    code = ErrorCode.AUTHORIZATION_DOES_NOT_COVER.value
    state_name = "NotConfirmed"
    exit_code = ExitCode.NOT_CONFIRMED


class ContractVersionUnsupported(ItoAPIError):
    """The backend no longer takes what this client sent: one of them must be upgraded."""

    code = ErrorCode.CONTRACT_VERSION_UNSUPPORTED.value
    state_name = "BackendError"
    exit_code = ExitCode.ERROR


class SpendAuthorizationNotFound(ItoAPIError):
    """The backend knows no such standing authorization for this account (contract v0.4)."""

    code = ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND.value
    state_name = "NotFound"
    exit_code = ExitCode.NOT_FOUND


_API_ERRORS: dict[str, type[ItoAPIError]] = {
    cls.code: cls
    for cls in (
        Unauthenticated,
        TokenRevoked,
        InsufficientScope,
        ValidationFailed,
        NotFound,
        BookingNotFound,
        BookingNotEligible,
        CapabilityNotAvailable,
        IdempotencyKeyReused,
        IdempotencyKeyInFlight,
        BookingBusy,
        RunNotFound,
        ActionNotPending,
        DecisionConflict,
        RateLimited,
        BackendUnavailable,
        AuthorizationPending,
        SlowDown,
        AccessDenied,
        ExpiredToken,
        InternalError,
        ConfirmationRequired,
        ConfirmationMismatch,
        ConfirmationExpired,
        ConfirmationUsed,
        PayloadTooLarge,
        ClientReferenceInUse,
        QuoteNotFound,
        QuoteAlreadyDecided,
        SpendAuthorizationNotFound,
        AuthorizationDoesNotCover,
        ContractVersionUnsupported,
    )
}


def error_from_envelope(
    code: str,
    message: str,
    *,
    status_code: int | None = None,
    request_id: str | None = None,
    field: str | None = None,
    retry_after: float | None = None,
) -> ItoAPIError:
    """Return the error for an envelope's ``error.code``: the one place codes map to classes.

    Args:
        code: The envelope's ``error.code``.
        message: The envelope's ``error.message`` (safe by contract).
        status_code: The HTTP status of the answer.
        request_id: The backend's request id, if any.
        field: The envelope's ``error.field``, if any.
        retry_after: The parsed ``Retry-After``, kept by :class:`RateLimited` and
            :class:`IdempotencyKeyInFlight`.

    Returns:
        An instance of the matching subclass, or of :class:`ItoAPIError` for an unknown code.
    """
    common: dict[str, Any] = {
        "status_code": status_code,
        "request_id": request_id,
        "field": field,
    }
    cls = _API_ERRORS.get(code)
    if cls is None:
        return ItoAPIError(message, code=code, **common)
    if cls is RateLimited or cls is IdempotencyKeyInFlight:
        return cls(message, retry_after=retry_after, **common)
    return cls(message, **common)


# --- local conditions -----------------------------------------------------------------------------


class NotLoggedIn(ItoError):
    """No token was found in the environment or the keyring.

    ``reason`` says why the keyring was not consulted, when it could not be used.
    """

    code = "NOT_LOGGED_IN"
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION

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


class TokenWithoutOrigin(ItoError):
    """``ITO_COMPUTE_TOKEN`` is set without ``ITO_COMPUTE_API_URL``, the origin it belongs to.

    A token is sent only to its own backend's origin; one that names none is sent nowhere.
    """

    code = "TOKEN_WITHOUT_ORIGIN"
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


class InvalidParameters(ItoError, ValueError):
    """A flow, job or command parameter breaks a rule; nothing was sent to the backend.

    Attributes:
        field: The parameter that breaks the rule, when it is one parameter.
    """

    code = "INVALID_PARAMETERS"
    state_name = "InvalidParameters"
    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OriginNotAllowed(InvalidParameters):
    """A backend URL read from Prefect names an origin this process is not configured for.

    Nothing was sent to it. The operator allows an origin with ``ITO_COMPUTE_ALLOWED_ORIGINS`` in
    the worker's and the watcher's own environment (see :mod:`prefect_ito.backend.origins`).

    Attributes:
        origin: The origin that was refused.
    """

    code = "ORIGIN_NOT_ALLOWED"
    state_name = "OriginNotAllowed"
    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, message: str, *, origin: str) -> None:
        super().__init__(message, field="api_url")
        self.origin = origin


class SpendDeclined(ItoError):
    """A person declined the spend: nothing was submitted."""

    code = "SPEND_DECLINED"
    state_name = "Declined"
    exit_code = ExitCode.DECLINED


class AwaitingConfirmation(ItoError):
    """Nobody confirmed or declined the spend in time: nothing was submitted."""

    code = "AWAITING_CONFIRMATION"
    state_name = "AwaitingConfirmation"
    exit_code = ExitCode.NOT_CONFIRMED


class DeadlineExceeded(ItoError):
    """Supervision reached its overall deadline; the backend run was left as it is."""

    code = "DEADLINE_EXCEEDED"
    state_name = "DeadlineExceeded"
    exit_code = ExitCode.RUN_OUTCOME


class Detached(ItoError):
    """The person at the terminal detached (Ctrl-C); the backend run goes on unsupervised."""

    code = "DETACHED"
    state_name = "Detached"
    exit_code = ExitCode.DETACHED


class FlowRunNotFound(ItoError):
    """Prefect knows no such flow run."""

    code = "FLOW_RUN_NOT_FOUND"
    state_name = "NotFound"
    exit_code = ExitCode.NOT_FOUND


class NothingToDecide(ItoError):
    """The flow run does not wait for a decision (it is not paused for one)."""

    code = "NOTHING_TO_DECIDE"
    state_name = "NothingToDecide"
    exit_code = ExitCode.INVALID_INPUT


class AnsweredByAnother(ItoError):
    """Another answer to the question was taken first; Prefect dropped this one.

    Several people (or scripts) may press Resume on one pause at once. Prefect keeps one answer
    and drops the others without an error, so ``prefect-ito decide`` reads back which it kept.
    """

    code = "ANSWERED_BY_ANOTHER"
    state_name = "AnsweredByAnother"
    exit_code = ExitCode.ANSWERED_BY_ANOTHER


class PrefectServerRequired(ItoError):
    """The command needs a real Prefect server (``PREFECT_API_URL``), not the ephemeral one."""

    code = "PREFECT_SERVER_REQUIRED"
    state_name = "Failed"
    exit_code = ExitCode.ERROR


class PrefectUnreachable(ItoError):
    """The Prefect API did not answer."""

    code = "PREFECT_UNREACHABLE"
    state_name = "Failed"
    exit_code = ExitCode.ERROR


class NoUsableKeyring(ItoError):
    """No keyring a token can be kept in: none is available, or it cannot be read or written.

    Attributes:
        reason: Why, in a few words (the message also says what to do instead).
    """

    code = "NO_USABLE_KEYRING"
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class InsecureKeyring(NoUsableKeyring):
    """The keyring backend keeps secrets in a plaintext file, and that was not allowed."""

    code = "INSECURE_KEYRING"
    state_name = "Unauthenticated"
    exit_code = ExitCode.AUTHENTICATION


# --- run outcomes ---------------------------------------------------------------------------------


class ItoRunOutcome(ItoError):
    """A training run ended, or stopped, without success.

    Attributes:
        run_id: The backend's run id, when known.
    """

    code = "RUN_OUTCOME"
    state_name = "RunOutcome"
    exit_code = ExitCode.RUN_OUTCOME

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class GateFailed(ItoRunOutcome):
    """A stage's eval gate failed, which stops the run.

    Attributes:
        stage: The stage whose gate failed.
        eval_name: The eval that missed its threshold.
        score: The score it reached.
        threshold: The threshold it had to meet.
    """

    code = "GATE_FAILED"
    state_name = "GateFailed"
    exit_code = ExitCode.RUN_OUTCOME

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


class RunRefused(ItoRunOutcome):
    """The backend refused the run (e.g. wasteful parallelism, or the ladder rejected the data)."""

    code = "RUN_REFUSED"
    state_name = "Refused"
    exit_code = ExitCode.RUN_OUTCOME


class BudgetExhausted(ItoRunOutcome):
    """The run reached its spend ceiling."""

    code = "BUDGET_EXHAUSTED"
    state_name = "BudgetExhausted"
    exit_code = ExitCode.RUN_OUTCOME


class RunStalled(ItoRunOutcome):
    """The run's heartbeat stopped advancing."""

    code = "RUN_STALLED"
    state_name = "Stalled"
    exit_code = ExitCode.RUN_OUTCOME


class RunCancelled(ItoRunOutcome):
    """The run was cancelled."""

    code = "RUN_CANCELLED"
    state_name = "Cancelled"
    exit_code = ExitCode.CANCELLED


class RunFailed(ItoRunOutcome):
    """The run failed on the backend."""

    code = "RUN_FAILED"
    state_name = "RunFailed"
    exit_code = ExitCode.RUN_OUTCOME


class AwaitingDecision(ItoRunOutcome):
    """The run is held for a human decision that has not been given."""

    code = "AWAITING_DECISION"
    state_name = "AwaitingDecision"
    exit_code = ExitCode.AWAITING_DECISION


class DecisionRequired(ItoRunOutcome):
    """The run needs a person to decide on a pending action.

    Attributes:
        action: The pending action the backend is holding the run for.
    """

    code = "DECISION_REQUIRED"
    state_name = "AwaitingDecision"
    exit_code = ExitCode.AWAITING_DECISION

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
