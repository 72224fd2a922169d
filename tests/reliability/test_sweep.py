"""The sweep, run after every other reliability test: no token anywhere, nothing done alone.

Every bearer token of this suite is a canary: minted by a simulator for one test, used for real,
and searched for afterwards — together with anything shaped like a simulator token — in
everything the suite can read: every test's captured stdout, stderr and log records, command
output, exception and state texts, what Prefect's API answers (block documents with their
secrets, logs, flow runs with their parameters and states, artifacts, events), and every byte of
the files under the test session's Prefect homes (the server's SQLite database and log, result
files). The demo runs here first, with its own token as one more canary.

The commands' ``--json`` documents, good and bad, are searched too, and, where the suite has a
PostgreSQL cluster (``PREFECT_ITO_POSTGRES_URL``, as CI does), every row of every Prefect database
on it: the end-to-end tests' and the crash trials'.

Then every request any simulator of the suite answered is checked against the contract's
endpoints, every restart decision posted against the answers people gave, and every backend run
any simulator made for a spend confirmation on record.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import keyring
import pytest
from prefect.client.orchestration import get_client
from reliability_kit import SWEEP, Sweep, answer_key, request_for

from prefect_ito.cli import demo
from prefect_ito.contract import ALL_SCOPES
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.supervision.outcomes import exit_code

POSTGRES_URL = "PREFECT_ITO_POSTGRES_URL"
DATABASES = "SELECT datname FROM pg_database WHERE datname LIKE 'prefect%' ORDER BY datname"
TABLES = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
TOKEN_SHAPE = re.compile(r"itosim_[A-Za-z0-9_-]{32}")
"""What every token the simulator mints looks like: any of them found anywhere is a leak."""
OPENAPI = Path(__file__).parents[2] / "docs" / "contract" / "ito-training-v0.openapi.json"
PAGE = 200


def test_the_demo_runs_with_its_token_as_a_canary(
    prefect_server, monkeypatch, capfd, sweep: Sweep, ledger
):
    minted, answered = _spy_on_the_demo(monkeypatch, sweep)
    saved = keyring.get_keyring()
    try:
        code = int(exit_code(demo.run_demo("demo", interactive=False)))
    finally:
        keyring.set_keyring(saved)  # the demo keeps its token in a keyring of its own
    out, err = capfd.readouterr()
    sweep.text("demo stdout", out)
    sweep.text("demo stderr", err)

    ledger.record("secrets", trials=1, outcomes={f"demo exit {code}": 1})
    assert code == 0, out + err
    assert minted and answered  # the canary was used, and the demo's operator answered
    assert "approves" in out


def _spy_on_the_demo(monkeypatch: pytest.MonkeyPatch, sweep: Sweep) -> tuple[list[str], list[str]]:
    """Learn the demo's token and answers, and keep its simulator's request log, unchanged."""
    minted: list[str] = []
    answered: list[str] = []
    mint, stop = SimulatorServer.mint_token, SimulatorServer.stop
    operate = demo.ScriptedOperator.__call__

    def mint_token(self: SimulatorServer, account: str = "sim-user", **options: Any) -> Any:
        token = mint(self, account, **options)
        minted.append(token.get_secret_value())
        sweep.canaries.add(minted[-1])
        return token

    def stopping(self: SimulatorServer) -> None:
        if self._url is not None:
            sweep.requests += self.requests()
            sweep.runs += [admin.run for admin in self.runs()]
        stop(self)

    async def answer(self: Any, flow_run: Any, description: str) -> Any:
        decision = await operate(self, flow_run, description)
        if decision is not None and flow_run.state is not None:
            answered.append(flow_run.state.state_details.pause_key)
            sweep.answered.add(answered[-1])
        return decision

    monkeypatch.setattr(SimulatorServer, "mint_token", mint_token)
    monkeypatch.setattr(SimulatorServer, "stop", stopping)
    monkeypatch.setattr(demo.ScriptedOperator, "__call__", answer)
    return minted, answered


def test_every_command_answers_in_json_without_its_token(prefect_server, sweep: Sweep, ledger):
    """The commands' ``--json`` documents, good and bad, go to the sweep with their token."""
    with SimulatorServer(builtin_scenario("default")) as simulator:
        # A person's token: `train --confirm` confirms the quote with it at the backend.
        scopes = [scope.value for scope in ALL_SCOPES]
        token = simulator.mint_token("json", scopes=scopes, principal="user:ada").get_secret_value()
        sweep.canaries.add(token)
        env = {
            **os.environ,
            "PREFECT_API_URL": prefect_server,
            "ITO_COMPUTE_API_URL": simulator.url,
            "ITO_COMPUTE_TOKEN": token,
        }
        request = request_for("bk-h200-2x8-ib")
        training = [
            "--booking", request.booking_id, "--model-size", request.model_size,
            "--data", request.data_refs[0], "--target", request.target,
            "--budget-usd", str(request.budget_usd),
        ]  # fmt: skip
        commands = {
            "whoami": ["whoami"],
            "quote": ["quote", *training],
            "train": ["train", *training, "--confirm", _quote(simulator.url, token, request)],
            "runs show": ["runs", "show", "--booking", request.booking_id],
        }
        codes = {name: _run_json(args, env, sweep) for name, args in commands.items()}
        simulator_revoke = httpx.post(
            f"{simulator.url}/v0/auth/revoke", headers={"Authorization": f"Bearer {token}"}
        )
        codes["whoami, token revoked"] = _run_json(["whoami"], env, sweep)
        sweep.requests += simulator.requests()
        sweep.runs += [admin.run for admin in simulator.runs()]

    ledger.record("secrets", trials=len(codes), outcomes={"--json documents": len(codes)})
    assert simulator_revoke.status_code == 200
    assert codes == {
        "whoami": 0, "quote": 0, "train": 0, "runs show": 0,
        "whoami, token revoked": ExitCode.AUTHENTICATION,
    }  # fmt: skip


def _quote(url: str, token: str, request: Any) -> str:
    """Return the id of a fresh quote for ``request`` at the backend at ``url``."""
    response = httpx.post(
        f"{url}/v0/training-quotes",
        json=request.to_submission().model_dump(mode="json"),
        headers={"Authorization": f"Bearer {token}"},
    )
    response.raise_for_status()
    return str(response.json()["data"]["quote_id"])


def _run_json(args: list[str], env: dict[str, str], sweep: Sweep) -> int:
    """Run one command with ``--json`` and no terminal; keep all it printed for the sweep."""
    result = subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", *args, "--json"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    sweep.text(f"--json {args[0]} stdout", result.stdout)
    sweep.text(f"--json {args[0]} stderr", result.stderr)
    json.loads(result.stdout)  # one document, whatever the outcome
    return result.returncode


def test_no_token_appears_anywhere_the_suite_can_read(prefect_server, ledger):
    import asyncio

    canaries = set(SWEEP.canaries)
    places: dict[str, list[str]] = {"test output, logs and exception texts": []}
    places["test output, logs and exception texts"] = [text for _, text in SWEEP.texts]
    places.update(asyncio.run(_what_prefect_answers()))
    postgres = os.environ.get(POSTGRES_URL)
    if postgres:
        places.update(asyncio.run(_every_postgres_row(postgres)))
    files = _prefect_home_files()

    leaks = Counter()
    for place, texts in places.items():
        for text in texts:
            leaks[place] += sum(c in text for c in canaries) + len(TOKEN_SHAPE.findall(text))
    for path in files:
        data = path.read_bytes()
        leaks[f"file {path.name}"] += len(re.findall(TOKEN_SHAPE.pattern.encode(), data))
    found = {place: count for place, count in leaks.items() if count}
    scanned = sum(len(texts) for texts in places.values())
    ledger.record(
        "secrets",
        trials=len(canaries),
        faults={"canary tokens": len(canaries)},
        outcomes={"places with a canary": len(found)},
        leaks=sum(found.values()),
        measures={
            "texts searched": f"{scanned:,} ("
            + ", ".join(f"{place} {len(texts):,}" for place, texts in places.items())
            + ")",
            "files searched byte for byte": f"{len(files)} "
            f"({sum(p.stat().st_size for p in files) / 1e6:.1f} MB: SQLite database, "
            "server log, result files)",
            "PostgreSQL": f"every row of every table of {_databases(places)} "
            "(the end-to-end tests' and the crash trials' Prefect servers)"
            if postgres
            else f"not reached: {POSTGRES_URL} is not set (CI sets it)",
            "--json output": "every document of the commands above, good and bad, and of "
            "`tests/cli/test_cli_json.py` (which checks its own token is in none)",
        },
    )
    assert canaries and scanned and files  # at least the demo's: the search proves something
    assert found == {}


async def _what_prefect_answers() -> dict[str, list[str]]:
    """Everything Prefect's API answers that could hold a token, as JSON texts by place."""
    async with get_client() as client:
        blocks = await client.read_block_documents(include_secrets=True)
        logs = await _every_page(client.read_logs)
        runs = await _every_page(client.read_flow_runs)
        task_runs = await _every_page(client.read_task_runs)
        artifacts = await _every_page(client.read_artifacts)
        events = await _every_event(client)
    return {
        "block documents (with secrets)": [b.model_dump_json() for b in blocks],
        "Prefect logs": [log.model_dump_json() for log in logs],
        "flow runs (parameters, states)": [run.model_dump_json() for run in runs],
        "task runs": [run.model_dump_json() for run in task_runs],
        "artifacts": [artifact.model_dump_json() for artifact in artifacts],
        "events": events,
    }


async def _every_page(read: Any) -> list[Any]:
    items: list[Any] = []
    while True:
        page = await read(limit=PAGE, offset=len(items))
        items += page
        if len(page) < PAGE:
            return items


async def _every_event(client: Any) -> list[str]:
    """Every event Prefect holds, page by page, as JSON texts."""
    http = client._client
    texts: list[str] = []
    answer = (await http.post("/events/filter", json={"limit": 50})).json()
    for _ in range(1_000):
        texts += [json.dumps(event) for event in answer.get("events", [])]
        following = answer.get("next_page")
        if not following:
            break
        answer = (await http.get(following)).json()
    return texts


async def _every_postgres_row(url: str) -> dict[str, list[str]]:
    """Every row of every table of every Prefect database on the suite's PostgreSQL cluster.

    The end-to-end tests' server uses the database of ``url``; the crash trials make their own
    (``prefect_trials_…``) on the same cluster.
    """
    import asyncpg

    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    first = await asyncpg.connect(dsn)
    try:
        names = [r["datname"] for r in await first.fetch(DATABASES)]
    finally:
        await first.close()
    rows: dict[str, list[str]] = {}
    for name in names:
        connection = await asyncpg.connect(f"{dsn.rsplit('/', 1)[0]}/{name}")
        try:
            for table in await connection.fetch(TABLES):
                query = f'SELECT t::text AS row FROM public."{table["table_name"]}" t'
                rows.setdefault(f"PostgreSQL {name}", []).extend(
                    r["row"] for r in await connection.fetch(query)
                )
        finally:
            await connection.close()
    return rows


def _databases(places: dict[str, list[str]]) -> str:
    names = [place.removeprefix("PostgreSQL ") for place in places if place.startswith("Postgre")]
    plural = "s" if len(names) != 1 else ""
    return f"{len(names)} database{plural} ({', '.join(names)})"


def _prefect_home_files() -> list[Path]:
    """Every file under this session's Prefect homes: the client's and the server's."""
    homes = {Path(os.environ["PREFECT_HOME"]), Path(os.environ["PREFECT_HOME"]).parent / "server"}
    return [path for home in homes for path in home.rglob("*") if path.is_file()]


def test_the_backend_only_ever_saw_the_contract_and_no_decision_nobody_took(ledger):
    routes = _contract_routes()
    requests = SWEEP.requests
    outside = [f"{e.method} {e.path}" for e in requests if not _in_contract(e, routes)]
    decisions = [e for e in requests if e.method == "POST" and e.path.endswith("/decision")]
    unanswered = [
        e.path for e in decisions if answer_key(e.path.split("/")[-2]) not in SWEEP.answered
    ]
    # Every run any simulator of the suite made must carry who confirmed its spend.
    runs = SWEEP.runs
    unconfirmed = [run.run_id for run in runs if run.confirmation is None]
    confirmed = Counter(run.confirmation.via for run in runs if run.confirmation)
    ledger.record(
        "never-alone",
        trials=len(requests),
        outcomes={
            "requests to a contract endpoint": len(requests) - len(outside),
            "decision requests on an action a person answered": len(decisions) - len(unanswered),
        },
        measures={
            "requests outside the contract": str(len(outside)),
            "decisions posted without a person's answer": str(len(unanswered)),
            "backend runs without a spend confirmation on record": str(len(unconfirmed)),
            "backend runs by who confirmed their spend": ", ".join(
                f"{via} {count}" for via, count in sorted(confirmed.items())
            ),
        },
    )
    assert requests and decisions and runs  # at least the demo's
    assert outside == []
    assert unanswered == []
    assert unconfirmed == []


def _contract_routes() -> list[tuple[str, re.Pattern[str]]]:
    document = json.loads(OPENAPI.read_text(encoding="utf-8"))
    routes = []
    for template, operations in document["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}/]+\}", "[^/]+", template) + "$")
        routes += [(method.upper(), pattern) for method in operations]
    return routes


def _in_contract(entry: Any, routes: list[tuple[str, re.Pattern[str]]]) -> bool:
    return any(entry.method == method and pattern.match(entry.path) for method, pattern in routes)
