"""What a terminal reads of the backend object a wait record names, as the backend states it.

The record is Prefect's, which anyone with API access may have written: what a person answers
about is read from the backend, with this terminal's own token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import ValidationError

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoCredentials
from prefect_ito.exceptions import ItoError
from prefect_ito.waiting.deferral import BackendRecord

T = TypeVar("T")


async def read_stated(record: BackendRecord, read: Callable[[ItoClient], Awaitable[T]]) -> T | None:
    """Return what ``read`` reads at the backend ``record`` names; None if it cannot be read."""
    try:
        credentials = ItoCredentials(api_url=record.api_url, keyring_entry=record.keyring_entry)
        async with credentials.get_client() as client:
            return await read(client)
    except (ItoError, ValidationError):  # a record nobody may follow, or an object not found
        return None
