"""Which simulator a request reached: its state, carried in the request's ASGI scope.

Every simulator of a process answers through one shared app (see ``app.py``), so a route or a
middleware finds its simulator's state in the request, not in the app.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_ito.simulator.state import SimState

STATE_KEY = "ito_simulator"
"""Where a request's ASGI ``state`` holds the simulator it reached."""


def with_state(scope: MutableMapping[str, Any], state: SimState) -> None:
    """Put ``state`` in ``scope`` as the simulator the request reached."""
    # A copy: the server may hand every request the same lifespan ``state`` mapping.
    scope["state"] = {**scope.get("state", {}), STATE_KEY: state}


def state_of(scope: MutableMapping[str, Any]) -> SimState:
    """Return the state of the simulator a request reached."""
    state: SimState = scope["state"][STATE_KEY]
    return state
