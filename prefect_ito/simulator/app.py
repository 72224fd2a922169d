"""The simulator's ASGI app: contract routes, admin routes, error envelopes, and the ticker."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Router
from starlette.types import Receive, Scope, Send

from prefect_ito.contract import SCHEMA_VERSION, ErrorCode, TrainingRunRequest
from prefect_ito.simulator import (
    admin,
    auth_routes,
    confirm_page,
    decide_page,
    routes,
    spend_routes,
)
from prefect_ito.simulator.builtins import builtin_scenario
from prefect_ito.simulator.envelopes import error_response
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.faults import FaultMiddleware
from prefect_ito.simulator.middleware import (
    BodyLimitMiddleware,
    BodyTooLarge,
    RequestLogMiddleware,
    too_large_response,
)
from prefect_ito.simulator.request_scope import with_state
from prefect_ito.simulator.scenario import Scenario
from prefect_ito.simulator.state import SimState

TICK_SECONDS = 0.02
"""How often the engine advances and long-polls are woken, in real seconds."""
TITLE = "Itô desk training API"
API_VERSION = SCHEMA_VERSION.removeprefix("ito.training.v")
"""The document's ``info.version``: the contract's, such as ``0.1``."""
DESCRIPTION = (
    f"Contract {SCHEMA_VERSION} of the Itô desk training API, served by prefect-ito's reference "
    "simulator. Every response is an envelope; see docs/contract.md."
)


class SimulatorApp:
    """One simulator as an ASGI app: its state and ticker, answering through the shared routes.

    Every simulator of a process answers through one FastAPI app (:func:`shared_routes`) and
    is told apart by the state it puts in each request's scope. FastAPI builds the validators of
    an app's routes on its first request, 0.15-0.2 s of CPU here; a test suite that starts
    hundreds of simulators paid that for each.

    Attributes:
        sim: The simulator's state.
    """

    def __init__(self, scenario: Scenario | None = None) -> None:
        self.sim = SimState.create(scenario or builtin_scenario("default"))
        # Starlette's own handling of the lifespan protocol, with the ticker as its context.
        self._lifespan = Router(lifespan=self._ticking)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan.lifespan(scope, receive, send)
            return
        with_state(scope, self.sim)
        await shared_routes()(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """Return the contract's OpenAPI document, as the app serves it at ``/openapi.json``."""
        return shared_routes().openapi()

    @contextlib.asynccontextmanager
    async def _ticking(self, _: object) -> AsyncIterator[None]:
        ticker = asyncio.create_task(_tick(self.sim))
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker


def create_app(scenario: Scenario | None = None) -> SimulatorApp:
    """Return a simulator app for a scenario (default: the built-in ``default``)."""
    return SimulatorApp(scenario)


@functools.cache
def shared_routes() -> FastAPI:
    """Return the contract's routes, middleware and error envelopes, built once per process.

    Shared by every simulator of the process (and its threads): nothing in it belongs to one
    simulator, whose state each request carries in its scope.
    """
    app = FastAPI(title=TITLE, version=API_VERSION, description=DESCRIPTION)
    app.include_router(routes.router)
    app.include_router(spend_routes.router)
    app.include_router(confirm_page.router)
    app.include_router(decide_page.router)
    app.include_router(auth_routes.router)
    app.include_router(auth_routes.page_router)
    app.include_router(admin.router)
    app.add_middleware(FaultMiddleware)
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(RequestLogMiddleware)
    app.add_exception_handler(SimError, _sim_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    # Built here, once: Starlette builds it on the first request otherwise, and simulators in
    # several threads could each start to.
    app.middleware_stack = app.build_middleware_stack()
    return app


async def _tick(state: SimState) -> None:
    """Advance the engine in the background and wake long-polls when a run changed."""
    seen = -1
    while True:
        state.engine.advance_changes()
        revision = state.engine.revision()
        if revision != seen:
            seen = revision
            async with state.changed:
                state.changed.notify_all()
        await asyncio.sleep(TICK_SECONDS)


async def _sim_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SimError)
    return error_response(
        exc.code, exc.message, field=exc.field, headers=exc.headers, details=exc.details
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    v03 = takes_a_submission(request.scope.get("route"))
    if v03 and any(_client_written_confirmation(error) for error in exc.errors()):
        return error_response(
            ErrorCode.CONTRACT_VERSION_UNSUPPORTED,
            f"this backend speaks {SCHEMA_VERSION}: a client-written `confirmation` (v0.3) is "
            "not taken. A submission names a `quote_id` a person confirmed at the backend, or "
            "an `authorization_id` that covers it; upgrade the client",
            field="confirmation",
        )
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ())]
    # A body that is not JSON at all points at the body, not at a character offset in it.
    field = "body" if first.get("type") == "json_invalid" else ".".join(loc[1:]) or "body"
    message = str(first.get("msg", "invalid request"))
    return error_response(ErrorCode.VALIDATION_ERROR, message, field=field)


def takes_a_submission(route: object) -> bool:
    """Whether ``route``'s body is a submission (a quote's or a run's), where v0.3 carried a
    client-written ``confirmation``: only there is one answered ``CONTRACT_VERSION_UNSUPPORTED``.
    """
    body = getattr(getattr(route, "body_field", None), "field_info", None)
    annotation = getattr(body, "annotation", None)
    return isinstance(annotation, type) and issubclass(annotation, TrainingRunRequest)


def _client_written_confirmation(error: dict[str, object]) -> bool:
    """Whether ``error`` is a v0.3 submission's own ``confirmation``, which v0.4 dropped.

    Told apart from any other unknown member so that a v0.3 client learns why, instead of
    reading "nobody confirmed" or "invalid request" without knowing its way of confirming is gone.
    """
    return error.get("type") == "extra_forbidden" and tuple(error.get("loc", ())) == (  # type: ignore[arg-type]
        "body",
        "confirmation",
    )


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if isinstance(exc, BodyTooLarge):
        return too_large_response(exc)
    if exc.status_code in (404, 405):
        # Unknown routes and methods: the contract has one NOT_FOUND code for both.
        return error_response(ErrorCode.NOT_FOUND, "no such route")
    return error_response(ErrorCode.VALIDATION_ERROR, "the request could not be read")
