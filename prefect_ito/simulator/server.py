"""Run the simulator with uvicorn in a background thread, on a real loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TypeVar

import httpx
import uvicorn
from pydantic import BaseModel, SecretStr

from prefect_ito.contract import Envelope, SpendAuthorization, SpendAuthorizationRequest
from prefect_ito.simulator.admin import AdminRun, MintedToken
from prefect_ito.simulator.app import SimulatorApp, create_app
from prefect_ito.simulator.builtins import builtin_scenario
from prefect_ito.simulator.scenario import Scenario, SimBooking
from prefect_ito.simulator.state import RequestLogEntry, SimState

STARTUP_TIMEOUT_SECONDS = 30.0
GRACEFUL_SHUTDOWN_SECONDS = 1
"""How long a stop waits for requests in flight; long-polls answer at once, well within it."""
M = TypeVar("M")


class SimUvicorn(uvicorn.Server):
    """uvicorn serving one simulator app, which answers its open long-polls when it stops.

    Left to itself, uvicorn waits for requests in flight and then cancels them, logging a
    traceback: a long-poll would be cut, and a person stopping a demo would see the error.
    """

    def __init__(self, app: SimulatorApp, host: str, port: int, log_level: str = "warning") -> None:
        # h11 explicitly: dropping a committed answer relies on how the protocol closes a
        # connection.
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http="h11",
            ws="none",
            log_level=log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        super().__init__(config)
        self._sim: SimState = app.sim
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """uvicorn's own loop (a tick every 0.1 s), woken at once by :meth:`exit_soon`.

        Left to its tick, every stop waited up to 0.1 s (0.1-0.2 s measured) for nothing: a
        test suite starts and stops hundreds of simulators.
        """
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    def exit_soon(self) -> None:
        """Ask the server to exit, from any thread, and wake its loop to see it."""
        self.should_exit = True
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed already
                self._loop.call_soon_threadsafe(self._wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Answer the long-polls, then shut down as uvicorn does."""
        await self._sim.close()
        await super().shutdown(sockets=sockets)


def bound_socket(host: str, port: int) -> socket.socket:
    """Return a TCP socket bound to ``host``:``port`` (0: a free port), for uvicorn to serve on.

    Raises:
        OSError: The address cannot be bound (in use, or not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Name the protocol: asyncio turns Nagle's algorithm off only for sockets that say they are
    # TCP, and without that every answer waits ~40 ms on the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class SimulatorServer:
    """The reference desk simulator, served by uvicorn in a thread.

    Example:
        >>> with SimulatorServer(builtin_scenario("loss-spike"), time_scale=4e6) as sim:
        ...     token = sim.mint_token()
        ...     httpx.get(f"{sim.url}/v0/capabilities", headers=...)
    """

    def __init__(
        self,
        scenario: Scenario | None = None,
        *,
        scaffold: bool = False,
        time_scale: float | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        base = scenario or builtin_scenario("default")
        self.scenario = base.with_options(scaffold=scaffold or None, time_scale=time_scale)
        self._host = host
        self._port = port
        self._server: SimUvicorn | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._url: str | None = None

    def __enter__(self) -> SimulatorServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The backend root, ``http://127.0.0.1:<port>``; contract paths are under ``/v0``."""
        if self._url is None:
            raise RuntimeError("the simulator is not running")
        return self._url

    def start(self) -> None:
        """Bind the port, serve in a thread, and return once the server answers."""
        if self._thread is not None:
            raise RuntimeError("the simulator is already running")
        # Binding here, before the thread starts, makes the port known at once (even port 0).
        sock = bound_socket(self._host, self._port)
        self._socket = sock
        host, port = sock.getsockname()[:2]
        self._url = f"http://{host}:{port}"
        server = SimUvicorn(create_app(self.scenario), self._host, self._port)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="ito-simulator", daemon=True
        )
        self._thread.start()
        if not self._wait_started():
            self.stop()
            raise RuntimeError("the simulator did not start")

    def _wait_started(self) -> bool:
        assert self._server is not None
        assert self._thread is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        """Ask uvicorn to exit, and join its thread."""
        if self._server is not None:
            self._server.exit_soon()
        if self._thread is not None:
            self._thread.join()
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = self._url = None

    # --- admin helpers: real HTTP calls to /_sim -------------------------------------------

    def _admin(self, method: str, path: str, model: type[M], json: Any = None) -> M:
        response = _admin_client().request(method, f"{self.url}/_sim{path}", json=json)
        response.raise_for_status()
        envelope = Envelope[model].model_validate_json(response.content)  # type: ignore[valid-type]
        return envelope.data

    def mint_token(
        self,
        account: str = "sim-user",
        *,
        scopes: Iterable[str] | None = None,
        principal: str | None = None,
    ) -> SecretStr:
        """Mint a bearer token for an account.

        Args:
            account: The account the token acts for.
            scopes: What it may do, such as ``["training:read"]``; default the four training
                scopes for a person (``user:…``), and for any other principal the workload's
                three, without ``training:decide``.
            principal: Who it speaks for; default ``user:<account>``.
        """
        body: dict[str, Any] = {"account": account}
        if scopes is not None:
            body["scopes"] = list(scopes)
        if principal is not None:
            body["principal"] = principal
        minted = self._admin("POST", "/tokens", MintedToken, body)
        return SecretStr(minted.token)

    def load_scenario(self, scenario: Scenario) -> None:
        """Load a scenario; bookings, runs, request log and clock start over."""
        self._admin("PUT", "/scenario", dict, _dump(scenario))

    def add_booking(self, booking: SimBooking) -> None:
        """Put a booking on file."""
        self._admin("POST", "/bookings", SimBooking, _dump(booking))

    def add_spend_authorization(
        self, authorization: SpendAuthorizationRequest, *, account: str, principal: str
    ) -> SpendAuthorization:
        """Put on file a standing authorization the person ``principal`` of ``account`` made.

        Seeding, like :meth:`add_booking`: it leaves no entry in the request log.
        """
        body = {
            "account": account,
            "principal": principal,
            "authorization": _dump(authorization),
        }
        return self._admin("POST", "/spend-authorizations", SpendAuthorization, body)

    def bookings(self) -> list[SimBooking]:
        """Return every booking on file."""
        return self._admin("GET", "/bookings", list[SimBooking])

    def requests(self) -> list[RequestLogEntry]:
        """Return the request log (never a token)."""
        return self._admin("GET", "/requests", list[RequestLogEntry])

    def runs(self) -> list[AdminRun]:
        """Return every run, with its account and idempotency key."""
        return self._admin("GET", "/runs", list[AdminRun])


@functools.cache
def _admin_client() -> httpx.Client:
    """Return the one client the admin helpers of every simulator in the process share.

    Making a client loads the CA bundle into a TLS context, about 60 ms of CPU here, which each
    simulator's start paid (a test suite starts hundreds). No connection is kept between calls,
    so none outlives the simulator it went to. httpx's client may be shared between threads.
    """
    return httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")
