"""``ItoClient``: the one HTTP client prefect-ito talks to an Itô desk backend through.

Every call goes through :meth:`ItoClient._request`, which sends, retries what is safe to retry
(see :mod:`prefect_ito.backend._retry`), and parses the answer into a contract v0 model. The bearer
token is held by an ``httpx.Auth`` as a ``SecretStr`` and attached only at send time.

The module is past ~400 lines because it is one method per contract endpoint around that one
choke point; the transport mapping, the retry policy, paging and provenance live beside it in
``_http``, ``_retry``, ``_paging`` and :mod:`prefect_ito.backend.provenance`.

Example:
    ```python
    from prefect_ito.blocks import ItoCredentials

    async with ItoCredentials.load("BLOCK_NAME").get_client() as client:
        capabilities = await client.get_capabilities()
    ```
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, SecretStr

from prefect_ito.backend._http import (
    BearerAuth,
    map_transport_errors,
    parse_response,
    peek_error_code,
)
from prefect_ito.backend._paging import P, follow_pages
from prefect_ito.backend._retry import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    LONG_POLL_MARGIN_SECONDS,
    RETRYABLE_STATUS,
    RetryBudget,
    backoff,
    parse_retry_after,
    retry_budget_for,
    should_retry,
)
from prefect_ito.backend.origins import origin_of
from prefect_ito.backend.provenance import Provenance, ResponseNotes
from prefect_ito.contract import (
    API_PREFIX,
    IDEMPOTENCY_HEADER,
    MAX_WAIT_SECONDS,
    SCHEMA_VERSION,
    CancelRequest,
    Capabilities,
    ChangePage,
    DecisionRequest,
    DeviceAuthorization,
    DeviceTokenRequest,
    EventPage,
    QuoteConfirmation,
    QuoteConfirmationRequest,
    Revocation,
    RunEvent,
    SpendAuthorization,
    SpendAuthorizationList,
    SpendAuthorizationRequest,
    Submission,
    TokenGrant,
    TrainingEligibility,
    TrainingQuote,
    TrainingRun,
    TrainingRunList,
    TrainingRunRequest,
    WhoAmI,
    segment_problem,
)
from prefect_ito.exceptions import InvalidParameters, ItoProtocolError, ItoTransportError
from prefect_ito.settings import current_settings

__all__ = ["DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT", "ItoClient"]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
Sleep = Callable[[float], Awaitable[None]]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Return one TLS context for every client in the process.

    Building a context loads the CA bundle (about 0.8 MiB); tasks make a client per call, and a
    process may supervise many runs at once.
    """
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class _Call:
    """One logical call: everything needed to send it again, unchanged, on a retry."""

    method: str
    template: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    idempotency_key: str | None = None
    timeout: httpx.Timeout | None = None
    repeatable: bool = False
    """A POST without a key that is still safe to send again: it creates nothing."""

    @property
    def endpoint(self) -> str:
        return f"{self.method} {self.template}"


def _segment(value: str, field: str) -> str:
    """Return the id ``value`` as one path segment; refuse one that would change the route.

    Everything is quoted, and what quoting cannot make safe — empty, ``.``, ``..``, or a
    separator a server decodes back (``%2F``) — is refused before anything is sent.

    Raises:
        InvalidParameters: ``value`` would change the request's path; names ``field``.
    """
    problem = segment_problem(value)
    if problem is not None:
        raise InvalidParameters(f"{field}: {problem}", field=field)
    return quote(value, safe="")


class ItoClient:
    """An async client for the Itô desk training API, contract v0.

    Args:
        base_url: The backend's root URL; contract paths live under ``/v0``.
        token: The bearer token, or None for the unauthenticated device-login calls.
        timeout: Per-request timeouts (a long poll stretches its read timeout to fit ``wait``).
        max_retries: Retries after the first attempt of one call.
        transport: An httpx transport to send through (tests plug a mock one in here).
        retry_budget: The budget this client's retries draw on. By default, the process's
            budget for ``base_url``, shared with every other client of that backend (see
            :mod:`prefect_ito.backend._retry`).
        sleep: How to wait between attempts.

    Example:
        ```python
        async with ItoClient("http://127.0.0.1:8765", token) as client:
            run = await client.get_training_run("run-1", after_version=3, wait=30)
        ```
    """

    def __init__(
        self,
        base_url: str,
        token: SecretStr | None = None,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
        retry_budget: RetryBudget | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._max_retries = max_retries
        self._budget = retry_budget or retry_budget_for(self._base_url)
        self._sleep = sleep
        self._notes = ResponseNotes(self._base_url)
        self._whoami: WhoAmI | None = None
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            auth=BearerAuth(token, origin_of(self._base_url)) if token is not None else None,
            # A redirect could lead elsewhere; the contract has none, so none is followed.
            follow_redirects=False,
            timeout=timeout,
            transport=transport,
            verify=_tls_context(),
            headers={"Accept": "application/json", "User-Agent": f"prefect-ito ({SCHEMA_VERSION})"},
        )

    @classmethod
    def from_settings(
        cls,
        base_url: str,
        token: SecretStr | None = None,
        *,
        timeout_seconds: float | None = None,
        max_retries: int | None = None,
    ) -> ItoClient:
        """Return a client configured from the ``PREFECT_INTEGRATIONS_ITO_*`` settings.

        Args:
            base_url: The backend's root URL.
            token: The bearer token, if any.
            timeout_seconds: Overrides the setting's request timeout when given.
            max_retries: Overrides the setting's retries when given.
        """
        settings = current_settings()
        return cls(
            base_url,
            token,
            timeout=settings.timeout(timeout_seconds),
            max_retries=settings.max_retries if max_retries is None else max_retries,
        )

    def __repr__(self) -> str:
        return f"ItoClient(base_url={self._base_url!r})"

    @property
    def base_url(self) -> str:
        """The backend's root URL."""
        return self._base_url

    @property
    def provenance(self) -> Provenance | None:
        """What the backend's last answer said of its origin; None before any answer."""
        return self._notes.provenance

    async def __aenter__(self) -> ItoClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # --- capabilities and bookings ------------------------------------------------------------

    async def get_capabilities(self) -> Capabilities:
        """Return what the backend offers (``GET /v0/capabilities``)."""
        call = _Call("GET", "/v0/capabilities", f"{API_PREFIX}/capabilities")
        return await self._request(call, Capabilities)

    async def get_training_eligibility(self, booking_id: str) -> TrainingEligibility:
        """Return the backend's view of a booking and whether it may train.

        Args:
            booking_id: The booking to ask about.
        """
        booking = _segment(booking_id, "booking_id")
        path = f"{API_PREFIX}/bookings/{booking}/training-eligibility"
        call = _Call("GET", "/v0/bookings/{booking_id}/training-eligibility", path)
        return await self._request(call, TrainingEligibility)

    # --- training runs ------------------------------------------------------------------------

    async def quote_training_run(self, request: TrainingRunRequest) -> TrainingQuote:
        """Return the backend's quote for a submission: plan preview, estimate, quote id.

        It creates no work and spends nothing, so it is retried like a read. A person confirms
        the quote, and the submission carries the confirmation (contract v0.3).

        Args:
            request: The submission body (its ``confirmation``, if any, is not needed); its
                ``client_reference`` (v0.5) goes with the quote.
        """
        unreferenced = request.client_reference is None
        call = _Call(
            "POST",
            "/v0/training-quotes",
            f"{API_PREFIX}/training-quotes",
            # A reference only when there is one: a backend before v0.3 knows no such field.
            body=request.model_dump(
                mode="json",
                exclude={"confirmation"} | ({"client_reference"} if unreferenced else set()),
            ),
            repeatable=True,
        )
        return await self._request(call, TrainingQuote)

    async def submit_training_run(
        self, request: TrainingRunRequest, *, idempotency_key: str
    ) -> Submission:
        """Submit a training run, at most once per idempotency key.

        After an ambiguous failure (the request may have arrived but the answer was lost) the
        run is first looked up by its key; only if none exists is the submission sent again,
        with the same key.

        Args:
            request: The submission body.
            idempotency_key: One key per logical submission, reused on every retry.

        Returns:
            The run, with ``replayed`` set when it already existed.
        """
        # Without a reference the member is left out: a backend before it refuses unknown members.
        unset = {"client_reference"} if request.client_reference is None else None
        call = _Call(
            "POST",
            "/v0/training-runs",
            f"{API_PREFIX}/training-runs",
            body=request.model_dump(mode="json", exclude=unset),
            idempotency_key=idempotency_key,
        )

        async def recover() -> Submission | None:
            run = await self.find_run_by_idempotency_key(idempotency_key)
            if run is not None:
                logger.info("Submission answer was lost; found run %s by its key", run.run_id)
                return Submission(run=run, replayed=True)
            return None

        return await self._request(call, Submission, recover=recover)

    async def find_run_by_idempotency_key(self, key: str) -> TrainingRun | None:
        """Return the run submitted with ``key``, or None if there is none."""
        runs = await self._list_runs({"idempotency_key": key})
        return runs[0] if runs else None

    async def find_runs_by_client_reference(self, reference: str) -> list[TrainingRun]:
        """Return the runs submitted with ``client_reference`` ``reference`` (at most one).

        Ask only a backend whose capabilities say ``client_reference: true``: one that does not
        know the filter would list every run. Runs that do not carry the reference are dropped
        here all the same.
        """
        runs = await self._list_runs({"client_reference": reference})
        return [run for run in runs if run.client_reference == reference]

    async def list_active_runs(self, booking_id: str) -> list[TrainingRun]:
        """Return a booking's unfinished runs, so a new supervisor can re-attach."""
        return await self._list_runs({"booking_id": booking_id, "active": "true"})

    async def list_runs(
        self,
        *,
        booking_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> list[TrainingRun]:
        """Return every run of this account the filters given match, oldest first.

        Args:
            booking_id: Only the runs on this booking, finished or not.
            idempotency_key: Only the run this key created.
        """
        filters = {"booking_id": booking_id, "idempotency_key": idempotency_key}
        return await self._list_runs({name: value for name, value in filters.items() if value})

    async def _list_runs(self, params: dict[str, Any]) -> list[TrainingRun]:
        """Return every run matching ``params``, following the pages' ``next`` cursors."""
        runs: list[TrainingRun] = []
        path = f"{API_PREFIX}/training-runs"
        async for page in self._pages("/v0/training-runs", path, params, TrainingRunList):
            runs += page.runs
        return runs

    async def get_training_run(
        self, run_id: str, *, after_version: int | None = None, wait: float | None = None
    ) -> TrainingRun:
        """Return a run; with ``after_version`` and ``wait``, long-poll for its next version.

        Args:
            run_id: The run to read.
            after_version: Answer as soon as the run's version exceeds this.
            wait: The most seconds to hold the request open (capped at 60 by the contract).

        Raises:
            ItoProtocolError: The run's version is older than ``after_version``.
        """
        params: dict[str, Any] = {}
        timeout = None
        if after_version is not None:
            params["after_version"] = after_version
        if wait is not None:
            params["wait"] = min(max(wait, 0.0), float(MAX_WAIT_SECONDS))
            timeout = self._long_poll_timeout(params["wait"])
        path = f"{API_PREFIX}/training-runs/{_segment(run_id, 'run_id')}"
        call = _Call("GET", "/v0/training-runs/{run_id}", path, params=params, timeout=timeout)
        run = await self._request(call, TrainingRun)
        if after_version is not None and run.version < after_version:
            # Versions only grow: an older one is a stale copy, and reporting it would show
            # stages going back. Stop with the contract breach rather than report it.
            raise ItoProtocolError(
                f"{call.endpoint} answered version {run.version}, older than version "
                f"{after_version} already seen",
                endpoint=call.endpoint,
                field="data.version",
            )
        return run

    def _long_poll_timeout(self, wait: float) -> httpx.Timeout:
        read = max(self._timeout.read or 0.0, wait + LONG_POLL_MARGIN_SECONDS)
        return httpx.Timeout(
            connect=self._timeout.connect,
            read=read,
            write=self._timeout.write,
            pool=self._timeout.pool,
        )

    async def list_changes(self, *, after: int | None = None, wait: float = 0) -> ChangePage:
        """Return the account's runs whose version moved after the cursor ``after``.

        Without ``after``: at once, no changes, and the current cursor to start from. With
        ``wait``, the backend holds the request until something changes (at most 60 s). Only a
        backend whose capabilities say ``change_feed`` serves it.
        """
        params: dict[str, Any] = {}
        timeout = None
        if after is not None:
            params["after"] = after
            params["wait"] = min(max(wait, 0.0), float(MAX_WAIT_SECONDS))
            timeout = self._long_poll_timeout(params["wait"])
        path = f"{API_PREFIX}/training-runs/changes"
        call = _Call("GET", "/v0/training-runs/changes", path, params=params, timeout=timeout)
        return await self._request(call, ChangePage)

    async def list_events(self, run_id: str, *, after: int = 0) -> EventPage:
        """Return a run's events after sequence number ``after``, every page of them.

        Returns:
            One page holding the events of every page the backend had, the ``last_seq`` of
            the last, and no ``next``.
        """
        path = f"{API_PREFIX}/training-runs/{_segment(run_id, 'run_id')}/events"
        events: list[RunEvent] = []
        last_seq = after
        template = "/v0/training-runs/{run_id}/events"
        async for page in self._pages(template, path, {"after": after}, EventPage):
            events += page.events
            last_seq = max(last_seq, page.last_seq)
        return EventPage(events=events, last_seq=last_seq)

    def _pages(
        self, template: str, path: str, params: dict[str, Any], model: type[P]
    ) -> AsyncIterator[P]:
        """Yield every page of a listing (see :func:`~prefect_ito.backend._paging.follow_pages`)."""

        async def fetch(query: dict[str, Any]) -> P:
            return await self._request(_Call("GET", template, path, params=query), model)

        return follow_pages(fetch, params, f"GET {template}")

    async def decide(
        self, run_id: str, action_id: str, decision: DecisionRequest, *, idempotency_key: str
    ) -> TrainingRun:
        """Record a person's decision on a pending action.

        Args:
            run_id: The run held for the decision.
            action_id: The pending action.
            decision: Approve or reject, by whom and why.
            idempotency_key: One key per logical decision, reused on every retry.
        """
        run, action = _segment(run_id, "run_id"), _segment(action_id, "action_id")
        path = f"{API_PREFIX}/training-runs/{run}/actions/{action}/decision"
        call = _Call(
            "POST",
            "/v0/training-runs/{run_id}/actions/{action_id}/decision",
            path,
            body=decision.model_dump(mode="json"),
            idempotency_key=idempotency_key,
        )
        return await self._request(call, TrainingRun)

    async def cancel_training_run(
        self, run_id: str, *, reason: str | None = None, idempotency_key: str
    ) -> TrainingRun:
        """Cancel a run's workload (never the booking).

        Args:
            run_id: The run to cancel.
            reason: Why, for the backend's record.
            idempotency_key: One key per logical cancel, reused on every retry.
        """
        call = _Call(
            "POST",
            "/v0/training-runs/{run_id}/cancel",
            f"{API_PREFIX}/training-runs/{_segment(run_id, 'run_id')}/cancel",
            body=CancelRequest(reason=reason).model_dump(mode="json"),
            idempotency_key=idempotency_key,
        )
        return await self._request(call, TrainingRun)

    # --- spend authority (contract v0.4 draft) ------------------------------------------------

    async def get_quote(self, quote_id: str) -> TrainingQuote:
        """Return a quote as the backend states it: its state and who confirmed or declined it.

        Args:
            quote_id: The quote, from :meth:`quote_training_run`.
        """
        path = f"{API_PREFIX}/training-quotes/{_segment(quote_id, 'quote_id')}"
        return await self._request(
            _Call("GET", "/v0/training-quotes/{quote_id}", path), TrainingQuote
        )

    async def confirm_quote(
        self, quote_id: str, *, note: str | None = None, idempotency_key: str
    ) -> QuoteConfirmation:
        """Confirm a quote as the person this client's token speaks for (``spend:confirm``).

        The backend records the token's principal; ``note`` is kept at most beside it. Only a
        person's token holds the scope: a workload's gets ``InsufficientScope``.

        Args:
            quote_id: The quote the person read.
            note: Optional, such as the name the person typed.
            idempotency_key: One key per logical confirmation, reused on every retry.
        """
        return await self._answer_quote(quote_id, "confirmations", note, idempotency_key)

    async def decline_quote(
        self, quote_id: str, *, note: str | None = None, idempotency_key: str
    ) -> QuoteConfirmation:
        """Decline a quote (``training:read`` is enough: declining spends nothing); final.

        Args:
            quote_id: The quote declined.
            note: Optional, such as why.
            idempotency_key: One key per logical decline, reused on every retry.
        """
        return await self._answer_quote(quote_id, "declines", note, idempotency_key)

    async def _answer_quote(
        self, quote_id: str, answer: str, note: str | None, idempotency_key: str
    ) -> QuoteConfirmation:
        quote = _segment(quote_id, "quote_id")
        call = _Call(
            "POST",
            f"/v0/training-quotes/{{quote_id}}/{answer}",
            f"{API_PREFIX}/training-quotes/{quote}/{answer}",
            body=QuoteConfirmationRequest(note=note).model_dump(mode="json", exclude_none=True),
            idempotency_key=idempotency_key,
        )
        return await self._request(call, QuoteConfirmation)

    async def create_spend_authorization(
        self, request: SpendAuthorizationRequest, *, idempotency_key: str
    ) -> SpendAuthorization:
        """Create a standing authorization (``spend:authorize``, a person's token only).

        Args:
            request: Its name, limits and expiry.
            idempotency_key: One key per logical authorization, reused on every retry: a
                resend after a lost answer gets the same authorization back.
        """
        call = _Call(
            "POST",
            "/v0/spend-authorizations",
            f"{API_PREFIX}/spend-authorizations",
            body=request.model_dump(mode="json"),
            idempotency_key=idempotency_key,
        )
        return await self._request(call, SpendAuthorization)

    async def list_spend_authorizations(self) -> list[SpendAuthorization]:
        """Return the account's standing authorizations, newest first, with what each used."""
        call = _Call("GET", "/v0/spend-authorizations", f"{API_PREFIX}/spend-authorizations")
        return (await self._request(call, SpendAuthorizationList)).authorizations

    async def get_spend_authorization(self, authorization_id: str) -> SpendAuthorization:
        """Return one of the account's standing authorizations."""
        call = _Call(
            "GET",
            "/v0/spend-authorizations/{authorization_id}",
            f"{API_PREFIX}/spend-authorizations/{_segment(authorization_id, 'authorization_id')}",
        )
        return await self._request(call, SpendAuthorization)

    async def revoke_spend_authorization(self, authorization_id: str) -> SpendAuthorization:
        """Revoke a standing authorization (``spend:authorize``); revoking twice is harmless.

        DELETE is idempotent by its nature, so it is retried without a key.
        """
        call = _Call(
            "DELETE",
            "/v0/spend-authorizations/{authorization_id}",
            f"{API_PREFIX}/spend-authorizations/{_segment(authorization_id, 'authorization_id')}",
            repeatable=True,
        )
        return await self._request(call, SpendAuthorization)

    # --- device authorization -----------------------------------------------------------------

    async def start_device_authorization(self) -> DeviceAuthorization:
        """Start a device login: the user code and the page where a person approves it."""
        call = _Call("POST", "/v0/auth/device", f"{API_PREFIX}/auth/device", body={})
        return await self._request(call, DeviceAuthorization)

    async def exchange_device_code(self, device_code: str) -> TokenGrant:
        """Ask whether a device login was approved; return the token once it was."""
        body = DeviceTokenRequest(device_code=device_code).model_dump(mode="json")
        call = _Call("POST", "/v0/auth/token", f"{API_PREFIX}/auth/token", body=body)
        return await self._request(call, TokenGrant)

    async def revoke_token(self) -> Revocation:
        """Revoke this client's own token on the backend."""
        call = _Call("POST", "/v0/auth/revoke", f"{API_PREFIX}/auth/revoke", body={})
        return await self._request(call, Revocation)

    async def whoami(self) -> WhoAmI:
        """Return the account, principal, backend, expiry and scopes of this client's token.

        Asked once per client: a token's identity does not change, and booking verification and
        the scope check both need it.
        """
        if self._whoami is None:
            call = _Call("GET", "/v0/auth/whoami", f"{API_PREFIX}/auth/whoami")
            self._whoami = await self._request(call, WhoAmI)
        return self._whoami

    # --- the choke point ----------------------------------------------------------------------

    async def _request(
        self,
        call: _Call,
        model: type[M],
        *,
        recover: Callable[[], Awaitable[M | None]] | None = None,
    ) -> M:
        """Send ``call`` until it succeeds, fails for good, or runs out of retries.

        Args:
            call: The call, re-sent unchanged (same idempotency key) on every retry.
            model: The contract model of the answer's ``data``.
            recover: After an ambiguous transport failure, find what the lost answer would
                have been; a non-None result ends the call.
        """
        attempt = 0
        while True:
            try:
                response = await self._send(call)
            except ItoTransportError as exc:
                if recover is not None and exc.ambiguous:
                    found = await recover()
                    if found is not None:
                        return found
                delay = self._retry_delay(call, attempt, None, None, None)
                if delay is None:
                    raise
            else:
                self._notes.observe_headers(call.endpoint, response)
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                code = peek_error_code(response)
                delay = self._retry_delay(call, attempt, response.status_code, retry_after, code)
                if delay is None:
                    if response.status_code not in RETRYABLE_STATUS:  # answered, not busy
                        self._budget.note_answer()
                    observe = self._notes.observe_envelope
                    return parse_response(response, model, call.endpoint, observe=observe)
            logger.debug("Retrying %s in %.2f s (retry %d)", call.endpoint, delay, attempt + 1)
            await self._sleep(delay)
            attempt += 1

    def _retry_delay(
        self,
        call: _Call,
        attempt: int,
        status_code: int | None,
        retry_after: float | None,
        error_code: str | None,
    ) -> float | None:
        """Return the wait before the next attempt, or None if there is to be none."""
        if not should_retry(
            method=call.method,
            idempotent=call.idempotency_key is not None or call.repeatable,
            status_code=status_code,
            attempt=attempt,
            max_retries=self._max_retries,
            retry_after=retry_after,
            error_code=error_code,
        ):
            return None
        if not self._budget.try_spend():
            logger.warning("Retry budget spent; not retrying %s", call.endpoint)
            return None
        return backoff(attempt, retry_after=retry_after)

    async def _send(self, call: _Call) -> httpx.Response:
        headers = {IDEMPOTENCY_HEADER: call.idempotency_key} if call.idempotency_key else {}
        with map_transport_errors(call.endpoint):
            return await self._http.request(
                call.method,
                call.path,
                params=call.params or None,
                json=call.body,
                headers=headers,
                timeout=call.timeout or self._timeout,
            )
