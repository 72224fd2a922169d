"""Deferred flow runs copied row by row in Prefect's database, and where a listing's time goes.

Setting up thousands of deferred runs through Prefect's API takes the server an hour and more on
a small machine: each is three writes (the flow run, its deferral record, its suspension), and
the server turns each state change into events of its own. The benchmark makes a few through the
API, exactly as a deferring flow run leaves them, then copies their rows for the rest: the flow
run (its parameters naming its own booking), every state of its history (``Scheduled``, then
``Suspended`` under the pause key of its own backend run), and its deferral record (the flow-run
input under that key). Only the events Prefect emitted for the copied states are not copied: the
watcher reads none of them (recovery reads heartbeat events of running flow runs only).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from prefect.client.schemas.objects import FlowRun
from prefect.server.database import orm_models
from pydantic import TypeAdapter
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import create_async_engine

Row = dict[str, Any]
FLOW_RUN = orm_models.FlowRun.__table__
STATE = orm_models.FlowRunState.__table__
INPUT = orm_models.FlowRunInput.__table__
CHUNK = 500
"""Rows per insert: SQLite binds at most 32,766 values a statement."""


def engine_for(database_url: str) -> Any:
    """Return an engine on Prefect's database; SQLite waits for the server's writes to end."""
    if database_url.startswith("sqlite"):
        return create_async_engine(database_url, connect_args={"timeout": 60})
    return create_async_engine(database_url)


async def copy_deferred(
    database_url: str,
    templates: list[str],
    copies: list[tuple[str, dict[str, Any], str]],
) -> list[str]:
    """Copy the deferred flow runs ``templates`` (ids), round robin, once per item of ``copies``:
    (the pause key of its backend run, its flow run's parameters, its deferral record as JSON).

    Return the new flow runs' ids, in the order of ``copies``.
    """
    engine = engine_for(database_url)
    try:
        async with engine.begin() as conn:
            rows = {t: await _rows_of(conn, uuid.UUID(t)) for t in templates}
            made: list[str] = []
            flow_runs: list[Row] = []
            states: list[Row] = []
            inputs: list[Row] = []
            current: list[tuple[uuid.UUID, uuid.UUID]] = []
            for (key, parameters, record), template in zip(
                copies, itertools.cycle(templates), strict=False
            ):
                run, its_states, its_inputs = rows[template]
                new_id = uuid.uuid4()
                made.append(str(new_id))
                state_ids = {s["id"]: uuid.uuid4() for s in its_states}
                flow_runs.append(_flow_run(run, new_id, parameters, len(made)))
                states += [_state(s, new_id, state_ids[s["id"]], key) for s in its_states]
                inputs += [_input(i, new_id, key, record) for i in its_inputs]
                current.append((new_id, state_ids[run["state_id"]]))
            # The flow run and its current state name each other: the state goes in second.
            for table, batch in ((FLOW_RUN, flow_runs), (STATE, states), (INPUT, inputs)):
                for start in range(0, len(batch), CHUNK):
                    await conn.execute(insert(table), batch[start : start + CHUNK])
            for flow_run_id, state_id in current:
                await conn.execute(
                    update(FLOW_RUN).where(FLOW_RUN.c.id == flow_run_id).values(state_id=state_id)
                )
        return made
    finally:
        await engine.dispose()


async def _rows_of(conn: Any, flow_run_id: uuid.UUID) -> tuple[Row, list[Row], list[Row]]:
    run = (await conn.execute(select(FLOW_RUN).where(FLOW_RUN.c.id == flow_run_id))).one()
    states = await conn.execute(select(STATE).where(STATE.c.flow_run_id == flow_run_id))
    inputs = await conn.execute(select(INPUT).where(INPUT.c.flow_run_id == flow_run_id))
    return (
        dict(run._mapping),
        [dict(s._mapping) for s in states],
        [dict(i._mapping) for i in inputs],
    )


def _flow_run(run: Row, new_id: uuid.UUID, parameters: dict[str, Any], n: int) -> Row:
    key = run["idempotency_key"]
    return {
        **run,
        "id": new_id,
        "name": f"{run['name']}-{n}",
        "parameters": parameters,
        "idempotency_key": None if key is None else f"{key}-{n}",
        "state_id": None,
    }


def _state(state: Row, flow_run_id: uuid.UUID, state_id: uuid.UUID, key: str) -> Row:
    details = dict(state["state_details"] or {})
    details["flow_run_id"] = str(flow_run_id)
    if details.get("pause_key"):
        details["pause_key"] = key
    return {**state, "id": state_id, "flow_run_id": flow_run_id, "state_details": details}


def _input(row: Row, flow_run_id: uuid.UUID, key: str, record: str) -> Row:
    # A deferred run holds one input: its deferral record, under its pause key.
    return {**row, "id": uuid.uuid4(), "flow_run_id": flow_run_id, "key": key, "value": record}


async def count_flow_runs(database_url: str) -> int:
    engine = engine_for(database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(FLOW_RUN))).scalar())
    finally:
        await engine.dispose()


async def listing_profile(api_url: str, body_for: Callable[[int], dict[str, Any]]) -> Row:
    """Time where one listing's time goes, page by page (200 a page, as the watcher reads):
    the server answering each page (the HTTP round trip, over loopback) and the client turning
    its JSON into flow runs (pydantic), and the size of a page."""
    adapter = TypeAdapter(list[FlowRun])
    served = parsed = 0.0
    pages = flow_runs = size = 0
    first_page = last_page = 0.0
    async with httpx.AsyncClient(base_url=api_url, timeout=120) as http:
        while True:
            start = time.perf_counter()
            response = await http.post("/flow_runs/filter", json=body_for(flow_runs))
            response.raise_for_status()
            took = time.perf_counter() - start
            served += took
            first_page = first_page or took
            last_page = took
            start = time.perf_counter()
            page = adapter.validate_json(response.content)
            parsed += time.perf_counter() - start
            pages, flow_runs, size = pages + 1, flow_runs + len(page), size + len(response.content)
            if len(page) < 200:
                break
    return {
        "pages": float(pages),
        "server_s": round(served, 2),
        "client_parse_s": round(parsed, 2),
        "first_page_s": round(first_page, 3),
        "last_page_s": round(last_page, 3),
        "kib_per_flow_run": round(size / 1024 / max(flow_runs, 1), 2),
    }


async def server_profile(database_url: str, filters: dict[str, Any]) -> Row:
    """Time, in this process on the server's own database, what Prefect's ``/flow_runs/filter``
    handler does for every page of a listing: the query (SQL and the ORM's loading of each flow
    run with its state) and turning each row into its response model and JSON."""
    from prefect.server import models, schemas
    from prefect.server.database import provide_database_interface
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    query = encode = 0.0
    offset = 0
    with temporary_settings(updates={PREFECT_API_DATABASE_CONNECTION_URL: database_url}):
        db = provide_database_interface()
        async with db.session_context() as session:
            while True:
                start = time.perf_counter()
                rows = await models.flow_runs.read_flow_runs(
                    session=session,
                    flow_filter=schemas.filters.FlowFilter.model_validate(filters["flows"]),
                    flow_run_filter=schemas.filters.FlowRunFilter.model_validate(
                        filters["flow_runs"]
                    ),
                    offset=offset,
                    limit=200,
                    sort=schemas.sorting.FlowRunSort.ID_DESC,
                )
                query += time.perf_counter() - start
                start = time.perf_counter()
                for row in rows:
                    schemas.responses.FlowRunResponse.model_validate(
                        row, from_attributes=True
                    ).model_dump(mode="json")
                encode += time.perf_counter() - start
                offset += len(rows)
                if len(rows) < 200:
                    break
    return {"server_query_s": round(query, 2), "server_encode_s": round(encode, 2)}
