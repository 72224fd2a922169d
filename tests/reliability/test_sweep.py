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
endpoints and the pages a person opens from its links, every decision any backend recorded for
the principal it names (a person's, since contract v0.5), and every backend run any simulator made
for a spend confirmation on record.

All of it over the whole run: when pytest-xdist runs the suite in several workers, this module
comes last, and its checks wait for every other worker's sweep of its own session and count it
with this one's (``sweeping.py``; ``test_sweep_across_workers.py`` shows a canary leaked in
another worker failing the sweep).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import httpx
import keyring
import pytest
from reliability_kit import SWEEP, Sweep, request_for
from sweeping import (
    Leaks,
    Verdict,
    check_conduct,
    count_tokens,
    search_for_tokens,
    this_worker,
    wait_for_other_workers,
    where,
)

from prefect_ito.cli import demo
from prefect_ito.contract import ALL_SCOPES
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.supervision.outcomes import exit_code

POSTGRES_URL = "PREFECT_ITO_POSTGRES_URL"
DATABASES = "SELECT datname FROM pg_database WHERE datname LIKE 'prefect%' ORDER BY datname"
TABLES = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"


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

    async def answer(self: Any, pause: Any) -> None:
        await operate(self, pause)  # decides at the backend as the demo's person
        if pause.action is not None:
            answered.append(pause.action.action_id)

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
    SWEEP.of_the_run = True
    # Every other session of the run has swept itself before its Prefect server stopped.
    verdicts = [_sweep_this_session(), *wait_for_other_workers()]
    postgres = os.environ.get(POSTGRES_URL)
    databases = asyncio.run(_every_postgres_row(postgres)) if postgres else {}
    rows = count_tokens(databases, set(SWEEP.canaries))

    found = {where(v.worker, place): n for v in verdicts for place, n in v.leaks.found.items()}
    found.update(rows.found)
    texts: Counter[str] = Counter(rows.texts)
    for verdict in verdicts:
        texts.update(verdict.leaks.texts)
    canaries = sum(v.leaks.canaries for v in verdicts)
    files = sum(v.leaks.files for v in verdicts)
    ledger.record(
        "secrets",
        trials=canaries,
        faults={"canary tokens": canaries},
        outcomes={"places with a canary": len(found)},
        leaks=sum(found.values()),
        measures={
            "sessions swept": _sessions(verdicts),
            "texts searched": f"{sum(texts.values()):,} ("
            + ", ".join(f"{place} {count:,}" for place, count in texts.items())
            + ")",
            "files searched byte for byte": f"{files} "
            f"({sum(v.leaks.file_bytes for v in verdicts) / 1e6:.1f} MB: SQLite databases, "
            "server logs, result files)",
            "PostgreSQL": f"every row of every table of {_databases(rows.texts)} "
            "(the end-to-end tests' and the crash trials' Prefect servers)"
            if postgres
            else f"not reached: {POSTGRES_URL} is not set (CI sets it)",
            "--json output": "every document of the commands above, good and bad, and of "
            "`tests/cli/test_cli_json.py` (which checks its own token is in none)",
        },
    )
    assert canaries and sum(texts.values()) and files  # at least the demo's: the search proves
    assert found == {}


def _sweep_this_session() -> Verdict:
    """Sweep this session as far as it went: every test of it but the sweep's is done."""
    return Verdict(this_worker(), search_for_tokens(SWEEP, prefect=True), check_conduct(SWEEP))


def _sessions(verdicts: list[Verdict]) -> str:
    if len(verdicts) == 1 and not verdicts[0].worker:
        return "1 (one process)"
    return f"{len(verdicts)} (pytest-xdist workers {', '.join(v.worker for v in verdicts)})"


async def _every_postgres_row(url: str) -> dict[str, list[str]]:
    """Every row of every table of every Prefect database on the suite's PostgreSQL cluster.

    The end-to-end tests' servers and the crash trials' each have a database of their own there
    (``tests/e2e/run_databases.py``); the run drops them once it is over.
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


def _databases(places: dict[str, int]) -> str:
    names = [place.removeprefix("PostgreSQL ") for place in places if place.startswith("Postgre")]
    plural = "s" if len(names) != 1 else ""
    return f"{len(names)} database{plural} ({', '.join(names)})"


def test_the_backend_only_ever_saw_the_contract_and_only_people_decided(ledger):
    SWEEP.of_the_run = True
    verdicts = [Verdict(this_worker(), Leaks(), check_conduct(SWEEP)), *wait_for_other_workers()]
    outside = [where(v.worker, path) for v in verdicts for path in v.conduct.outside]
    impersonal = [where(v.worker, record) for v in verdicts for record in v.conduct.impersonal]
    unconfirmed = [where(v.worker, run) for v in verdicts for run in v.conduct.unconfirmed]
    requests = sum(v.conduct.requests for v in verdicts)
    decisions = sum(v.conduct.decisions for v in verdicts)
    runs = sum(v.conduct.runs for v in verdicts)
    confirmed: Counter[str] = Counter()
    for verdict in verdicts:
        confirmed.update(verdict.conduct.confirmed)
    ledger.record(
        "never-alone",
        trials=requests,
        outcomes={
            "requests to a contract endpoint": requests - len(outside),
            "decisions recorded under a person's principal": decisions - len(impersonal),
        },
        measures={
            "sessions swept": _sessions(verdicts),
            "requests outside the contract": str(len(outside)),
            "decisions recorded under a principal not a person's": str(len(impersonal)),
            "backend runs without a spend confirmation on record": str(len(unconfirmed)),
            "backend runs by who confirmed their spend": ", ".join(
                f"{via} {count}" for via, count in sorted(confirmed.items())
            ),
        },
    )
    assert requests and decisions and runs  # at least the demo's
    assert outside == []
    assert impersonal == []
    assert unconfirmed == []
