"""Following a listing's pages: the first page, then each page its ``next`` cursor points to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from prefect_ito.contract import EventPage, TrainingRunList
from prefect_ito.exceptions import ItoProtocolError

P = TypeVar("P", TrainingRunList, EventPage)
MAX_PAGES = 1_000
"""The most pages one listing is followed through: a guard against a backend that loops."""


async def follow_pages(
    fetch: Callable[[dict[str, Any]], Awaitable[P]], params: dict[str, Any], endpoint: str
) -> AsyncIterator[P]:
    """Yield the page ``fetch(params)`` answers, then the pages its ``next`` cursors lead to.

    The filters of ``params`` are sent with every page; ``after`` only with the first, since a
    cursor carries the position from then on.

    Args:
        fetch: Reads one page for the given query parameters.
        params: The first page's query parameters.
        endpoint: The endpoint, for errors.

    Raises:
        ItoProtocolError: The backend repeated a cursor, or sent more than :data:`MAX_PAGES`.
    """
    seen: set[str] = set()
    page = await fetch(params)
    for _ in range(MAX_PAGES):
        yield page
        cursor = page.next
        if cursor is None:
            return
        if cursor in seen:
            raise ItoProtocolError(
                f"{endpoint} repeated a page cursor", endpoint=endpoint, field="data.next"
            )
        seen.add(cursor)
        following = {key: value for key, value in params.items() if key != "after"}
        page = await fetch(following | {"cursor": cursor})
    raise ItoProtocolError(
        f"{endpoint} answered more than {MAX_PAGES} pages", endpoint=endpoint, field="data.next"
    )
