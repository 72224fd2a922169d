"""The one table of outcomes: every way a call, a flow run or a command ends without success.

Each row of :data:`OUTCOMES` names an outcome by the class a caller catches, and gives its
stable upper-snake ``code`` (an envelope's ``error.code`` for the backend's own, and
``error.code`` in ``--json``), the name of the Prefect state a flow run ends in, the exit code of
a ``prefect-ito`` command that ends with it, the HTTP status a backend answers it with (None for
prefect-ito's own outcomes) and a message that says what it means. Everything else is read from
here, so nothing can drift:

- the classes of :mod:`prefect_ito.exceptions` (each states its row's code, state and exit code,
  and its row's message is its docstring and the message of one raised without any);
- the client's mapping of an error envelope to its class
  (:func:`~prefect_ito.exceptions.error_from_envelope`) and the simulator's statuses
  (:data:`ERROR_STATUS`);
- the final states of :mod:`prefect_ito.supervision.outcomes`;
- the exit-code table of ``docs/cli.md``: ``uv run python -m prefect_ito.outcomes`` rewrites it,
  and a test fails while it differs.

A message is safe to show and log: it is written here, and never holds a token. An error the
backend answers carries the backend's own ``error.message`` instead, which the contract declares
safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Final

from prefect_ito.contract import ErrorCode

__all__ = [
    "BY_NAME",
    "COMPLETED",
    "ERROR_STATUS",
    "OUTCOMES",
    "ExitCode",
    "Outcome",
    "exit_code_table",
    "with_exit_code_table",
]


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


COMPLETED: Final = "Completed"
"""The state a flow run that succeeded ends in (exit code 0): the one outcome with no row."""


@dataclass(frozen=True)
class Outcome:
    """One row of the table.

    Attributes:
        name: The class a caller catches, in :mod:`prefect_ito.exceptions`.
        code: The stable upper-snake code.
        state_name: The name of the final Prefect state a flow run ends in.
        exit_code: The exit code of a ``prefect-ito`` command that ends with it.
        status: The HTTP status a backend answers ``code`` with; None for prefect-ito's own.
        message: What it means, safe to show: lower case, without a final stop.
    """

    name: str
    code: str
    state_name: str
    exit_code: ExitCode
    status: int | None
    message: str

    @property
    def doc(self) -> str:
        """Return the message as a sentence: the docstring of the outcome's class."""
        return f"{self.message[:1].upper()}{self.message[1:]}."


_Row = tuple[str, str, str, int | None, str]

# Grouped by exit code, in the order docs/cli.md lists them. A note says what a message leaves
# out: whether the client sends it again, and what else raises it.
# fmt: off
_ROWS: dict[ExitCode, tuple[_Row, ...]] = {
    ExitCode.ERROR: (
        # class                       code                            final state          HTTP
        ("ItoTransportError",         "TRANSPORT_ERROR",              "BackendUnreachable", None,
         "the request did not complete: nothing, or not all of the answer, came back"),
        ("ItoTimeoutError",           "TIMEOUT",                      "BackendUnreachable", None,
         "a connect, read, write or pool timeout ran out"),
        ("ItoConnectionError",        "CONNECTION_ERROR",             "BackendUnreachable", None,
         "the connection failed or was dropped"),
        # Retried by the client; raised once its retries ran out.
        ("BackendUnavailable",        "BACKEND_UNAVAILABLE",          "BackendUnavailable", 503,
         "the backend is temporarily unavailable"),
        ("RateLimited",               "RATE_LIMITED",                 "BackendUnavailable", 429,
         "too many requests"),
        # The one 409 the client retries: after Retry-After, the same request with the same key.
        ("IdempotencyKeyInFlight",    "IDEMPOTENCY_KEY_IN_FLIGHT",    "BackendUnavailable", 409,
         "a request with this idempotency key is still being processed at the backend"),
        # An unknown code is this class itself, with the backend's code (and status).
        ("ItoAPIError",               "API_ERROR",                    "BackendError",       None,
         "the backend answered with an error envelope"),
        ("InternalError",             "INTERNAL_ERROR",               "BackendError",       500,
         "the backend failed unexpectedly"),
        ("ContractVersionUnsupported", "CONTRACT_VERSION_UNSUPPORTED", "BackendError",      400,
         "the backend no longer takes what this client sent: one of them must be upgraded"),
        ("ItoProtocolError",          "PROTOCOL_ERROR",               "ProtocolError",      None,
         "the backend answered, but not in the shape contract v0 defines"),
        ("ActionNotPending",          "ACTION_NOT_PENDING",           "DecisionNotRelayed", 409,
         "the action was not (or no longer) waiting for a decision"),
        # Final, never retried.
        ("DecisionConflict",          "DECISION_CONFLICT",            "DecisionNotRelayed", 409,
         "a different decision was already recorded for this action"),
        ("PrefectServerRequired",     "PREFECT_SERVER_REQUIRED",      "Failed",             None,
         "the command needs a real Prefect server (PREFECT_API_URL), not the ephemeral one"),
        ("PrefectUnreachable",        "PREFECT_UNREACHABLE",          "Failed",             None,
         "the Prefect API did not answer"),
        ("ItoError",                  "ITO_ERROR",                    "Failed",             None,
         "prefect-ito failed"),
    ),
    ExitCode.INVALID_INPUT: (
        ("InvalidParameters",         "INVALID_PARAMETERS",           "InvalidParameters",  None,
         "a parameter breaks a rule; nothing was sent to the backend"),
        ("OriginNotAllowed",          "ORIGIN_NOT_ALLOWED",           "OriginNotAllowed",   None,
         "a backend URL read from Prefect names an origin this process is not configured for"),
        ("ValidationFailed",          "VALIDATION_ERROR",             "InvalidParameters",  422,
         "the backend rejected the request body or parameters"),
        # Final, never retried: nothing was done with the body, and the backend's message names
        # its limit.
        ("PayloadTooLarge",           "PAYLOAD_TOO_LARGE",            "InvalidParameters",  413,
         "the request body is larger than the backend reads"),
        # Final, never retried.
        ("IdempotencyKeyReused",      "IDEMPOTENCY_KEY_REUSED",       "IdempotencyKeyReused", 409,
         "the idempotency key was already used with a different request"),
        # Final, never retried. prefect-ito's reference is the flow run's id, so the flow run
        # made its run before: it re-attaches to that run, and ends with this only when that run
        # is for a different request.
        ("ClientReferenceInUse",      "CLIENT_REFERENCE_IN_USE",      "ClientReferenceInUse", 409,
         "the client reference is already on another run of the account"),
        ("NothingToDecide",           "NOTHING_TO_DECIDE",            "NothingToDecide",    None,
         "the flow run does not wait for a decision (it is not paused for one)"),
    ),
    ExitCode.UNAVAILABLE: (
        ("CapabilityNotAvailable",    "CAPABILITY_NOT_AVAILABLE",     "Unavailable",        501,
         "the backend does not offer this capability (yet), e.g. training_run"),
    ),
    ExitCode.BOOKING: (
        ("BookingNotEligible",        "BOOKING_NOT_ELIGIBLE",         "BookingNotEligible", 409,
         "the booking exists but may not train (pending, expired, revoked or released)"),
        ("BookingNotFound",           "BOOKING_NOT_FOUND",            "BookingNotEligible", 404,
         "the backend knows no such booking"),
        ("BookingBusy",               "BOOKING_BUSY",                 "BookingBusy",        409,
         "the booking already has an unfinished run with a different manifest"),
    ),
    ExitCode.RUN_OUTCOME: (
        ("GateFailed",                "GATE_FAILED",                  "GateFailed",         None,
         "a stage's eval gate failed, which stops the run"),
        ("RunRefused",                "RUN_REFUSED",                  "Refused",            None,
         "the backend refused the run (e.g. wasteful parallelism, or the ladder rejected the "
         "data)"),
        ("BudgetExhausted",           "BUDGET_EXHAUSTED",             "BudgetExhausted",    None,
         "the run reached its spend ceiling"),
        ("RunFailed",                 "RUN_FAILED",                   "RunFailed",          None,
         "the run failed on the backend"),
        ("RunStalled",                "RUN_STALLED",                  "Stalled",            None,
         "the run's heartbeat stopped advancing"),
        ("DeadlineExceeded",          "DEADLINE_EXCEEDED",            "DeadlineExceeded",   None,
         "supervision reached its overall deadline; the backend run was left as it is"),
        ("ItoRunOutcome",             "RUN_OUTCOME",                  "RunOutcome",         None,
         "a training run ended, or stopped, without success"),
    ),
    ExitCode.AUTHENTICATION: (
        ("NotLoggedIn",               "NOT_LOGGED_IN",                "Unauthenticated",    None,
         "no token was found in the environment or the keyring"),
        # A token is sent only to its own backend's origin; one that names none is sent nowhere.
        ("TokenWithoutOrigin",        "TOKEN_WITHOUT_ORIGIN",         "Unauthenticated",    None,
         "ITO_COMPUTE_TOKEN is set without ITO_COMPUTE_API_URL, the origin it belongs to"),
        ("Unauthenticated",           "UNAUTHENTICATED",              "Unauthenticated",    401,
         "no valid bearer token: log in again with prefect-ito login"),
        ("TokenRevoked",              "TOKEN_REVOKED",                "Unauthenticated",    401,
         "the bearer token was revoked; work stops and no login is started by itself"),
        ("NoUsableKeyring",           "NO_USABLE_KEYRING",            "Unauthenticated",    None,
         "no keyring a token can be kept in: none is available, or it cannot be read or written"),
        ("InsecureKeyring",           "INSECURE_KEYRING",             "Unauthenticated",    None,
         "the keyring backend keeps secrets in a plaintext file, and that was not allowed"),
        # Device login, while it is polled.
        ("AuthorizationPending",      "AUTHORIZATION_PENDING",        "Unauthenticated",    400,
         "device login: the user has not approved yet; keep polling"),
        ("SlowDown",                  "SLOW_DOWN",                    "Unauthenticated",    400,
         "device login: polling too fast; add five seconds to the interval"),
        ("AccessDenied",              "ACCESS_DENIED",                "Unauthenticated",    400,
         "device login: the user refused"),
        ("ExpiredToken",              "EXPIRED_TOKEN",                "Unauthenticated",    400,
         "device login: the device code expired before it was approved"),
    ),
    ExitCode.AWAITING_DECISION: (
        ("AwaitingDecision",          "AWAITING_DECISION",            "AwaitingDecision",   None,
         "the run is held for a human decision that has not been given"),
        ("DecisionRequired",          "DECISION_REQUIRED",            "AwaitingDecision",   None,
         "the run needs a person to decide on a pending action"),
    ),
    ExitCode.CANCELLED: (
        ("RunCancelled",              "RUN_CANCELLED",                "Cancelled",          None,
         "the run was cancelled"),
    ),
    ExitCode.NOT_FOUND: (
        ("NotFound",                  "NOT_FOUND",                    "NotFound",           404,
         "no such resource"),
        ("RunNotFound",               "RUN_NOT_FOUND",                "NotFound",           404,
         "the backend knows no such training run"),
        ("QuoteNotFound",             "QUOTE_NOT_FOUND",              "NotFound",           404,
         "the backend knows no such quote for this account"),
        ("SpendAuthorizationNotFound", "SPEND_AUTHORIZATION_NOT_FOUND", "NotFound",         404,
         "the backend knows no such standing authorization for this account"),
        ("FlowRunNotFound",           "FLOW_RUN_NOT_FOUND",           "NotFound",           None,
         "Prefect knows no such flow run"),
    ),
    ExitCode.NOT_CONFIRMED: (
        # Answered by the backend to a submission without a confirmation, and raised by
        # prefect-ito itself before anything is sent when nobody could confirm (no terminal, no
        # --confirm, no standing authorization that covers the request).
        ("ConfirmationRequired",      "CONFIRMATION_REQUIRED",        "NotConfirmed",       428,
         "nobody confirmed the spend: a new run needs a person's confirmation of a quote"),
        ("ConfirmationMismatch",      "CONFIRMATION_MISMATCH",        "NotConfirmed",       409,
         "the confirmation is for another request: another quote, booking, manifest or budget"),
        ("ConfirmationExpired",       "CONFIRMATION_EXPIRED",         "NotConfirmed",       410,
         "the confirmed quote expired before the submission reached the backend"),
        ("ConfirmationUsed",          "CONFIRMATION_USED",            "NotConfirmed",       409,
         "the confirmed quote already made another run: one confirmation, one run"),
        # Final; the answer's details.state and details.principal say how and by whom.
        ("QuoteAlreadyDecided",       "QUOTE_ALREADY_DECIDED",        "NotConfirmed",       409,
         "the quote was already answered the other way, or by another person"),
        # The answer's details.reason says why; nothing was created, and a person may still
        # confirm the quote.
        ("AuthorizationDoesNotCover", "AUTHORIZATION_DOES_NOT_COVER", "NotConfirmed",       403,
         "the named standing authorization does not cover the quote now"),
        # A person asked to confirm (`prefect-ito confirm`) answered anything but yes: they
        # declined nothing, and the quote can still be confirmed or declined.
        ("NotConfirmed",              "NOT_CONFIRMED",                "NotConfirmed",       None,
         "the person did not confirm the spend: nothing was sent, and the quote stays open"),
        ("AwaitingConfirmation",      "AWAITING_CONFIRMATION",        "AwaitingConfirmation", None,
         "nobody confirmed or declined the spend in time: nothing was submitted"),
    ),
    ExitCode.DECLINED: (
        ("SpendDeclined",             "SPEND_DECLINED",               "Declined",           None,
         "a person declined the spend: nothing was submitted"),
    ),
    ExitCode.FORBIDDEN: (
        # Final, never retried: a person with the right to do it must act, or log in with a
        # token that carries the scope; nothing is asked again by itself.
        ("InsufficientScope",         "INSUFFICIENT_SCOPE",           "InsufficientScope",  403,
         "the token is valid but lacks the scope this call needs"),
    ),
    ExitCode.ANSWERED_BY_ANOTHER: (
        # Several people (or scripts) may press Resume on one pause at once. Prefect keeps one
        # answer and drops the others without an error, so `prefect-ito decide` reads back which
        # it kept.
        ("AnsweredByAnother",         "ANSWERED_BY_ANOTHER",          "AnsweredByAnother",  None,
         "another answer to the question was taken first; Prefect dropped this one"),
    ),
    ExitCode.DETACHED: (
        ("Detached",                  "DETACHED",                     "Detached",           None,
         "the person at the terminal detached (Ctrl-C); the backend run goes on unsupervised"),
        # A hangup (the terminal closed) or a termination signal: supervision stops, as at a
        # detach; an open question is left to others, never declined, and nothing is spent.
        ("TerminalClosed",            "TERMINAL_CLOSED",              "TerminalClosed",     None,
         "the terminal went away (a hangup or termination signal): nothing was declined or "
         "spent, and a backend run already submitted goes on unsupervised"),
    ),
}
# fmt: on

OUTCOMES: Final = tuple(
    Outcome(name, code, state_name, exit_code, status, message)
    for exit_code, rows in _ROWS.items()
    for name, code, state_name, status, message in rows
)
"""Every outcome but success, by exit code."""

BY_NAME: Final = {outcome.name: outcome for outcome in OUTCOMES}
"""Each outcome by the name of its class."""

ERROR_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode(outcome.code): outcome.status for outcome in OUTCOMES if outcome.status is not None
}
"""The HTTP status that goes with each code of the contract."""


def exit_code_table() -> str:
    """Return the exit-code table of ``docs/cli.md``: each exit code, its states and its codes."""
    lines = ["| exit code | `ExitCode` | final states | `error.code` |", "|---|---|---|---|"]
    for exit_code in ExitCode:
        rows = [outcome for outcome in OUTCOMES if outcome.exit_code is exit_code]
        states = [COMPLETED] if exit_code is ExitCode.SUCCESS else [row.state_name for row in rows]
        codes = ", ".join(f"`{row.code}`" for row in rows) or "—"
        named = ", ".join(f"`{state}`" for state in dict.fromkeys(states))
        lines.append(f"| {int(exit_code)} | `{exit_code.name}` | {named} | {codes} |")
    return "\n".join(lines) + "\n"


CLI_DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
TABLE_BEGINS = "<!-- Generated from the outcome table: uv run python -m prefect_ito.outcomes -->"
TABLE_ENDS = "<!-- End of the generated table. -->"


def with_exit_code_table(text: str) -> str:
    """Return ``text`` (``docs/cli.md``) with the table between its markers made anew."""
    head, begins, rest = text.partition(TABLE_BEGINS)
    _, ends, tail = rest.partition(TABLE_ENDS)
    if not (begins and ends):
        raise ValueError(f"the exit-code table's markers are missing: {TABLE_BEGINS}")
    return f"{head}{begins}\n\n{exit_code_table()}\n{ends}{tail}"


def main() -> None:
    """Rewrite the exit-code table of :data:`CLI_DOC`."""
    CLI_DOC.write_text(with_exit_code_table(CLI_DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the exit-code table of {CLI_DOC}")


if __name__ == "__main__":
    main()
