"""The sweep's searches, and the sweep across every session of one run.

One run of the suite may be several sessions: pytest-xdist's workers each have their own
:data:`~reliability_kit.SWEEP`, Prefect server and Prefect homes. So every worker sweeps its own
session once its tests are done (``conftest.py``: before its Prefect server stops) and leaves a
:class:`Verdict` in the run's directory: counts, places and request paths, never a token. The
worker that runs ``test_sweep.py``, the last module of the run, waits for every other worker's
verdict and checks them with its own. A canary of one worker that leaked in another is found
there too: every canary is a simulator token, and each sweep counts anything shaped like one.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from reliability_kit import Sweep

from prefect_ito.contract import PERSON_PRINCIPAL_PREFIX
from prefect_ito.simulator.ids import PERSON_PAGES

TOKEN_SHAPE = re.compile(r"itosim_[A-Za-z0-9_-]{32}")
"""What every token the simulator mints looks like: any of them found anywhere is a leak."""
OPENAPI = Path(__file__).parents[2] / "docs" / "contract" / "ito-training-v0.openapi.json"
PAGE = 200
WAIT_FOR_WORKERS = 2_400.0
"""How long the sweep waits for the other workers to finish their tests, at most (seconds)."""
TEXTS = "test output, logs and exception texts"


@dataclass
class Leaks:
    """What one session's search for tokens found."""

    canaries: int = 0
    texts: dict[str, int] = field(default_factory=dict)
    """How many texts each place held."""
    found: dict[str, int] = field(default_factory=dict)
    """Tokens found, by place (only places with one)."""
    files: int = 0
    file_bytes: int = 0


@dataclass
class Conduct:
    """What one session's simulators were asked, and which backend runs they made."""

    requests: int = 0
    outside: list[str] = field(default_factory=list)
    """Requests to no endpoint of the contract."""
    decisions: int = 0
    """Decisions the backends recorded on their runs."""
    impersonal: list[str] = field(default_factory=list)
    """Decisions recorded under a principal that is not a person's (``run/action principal``)."""
    runs: int = 0
    unconfirmed: list[str] = field(default_factory=list)
    """Backend runs without a spend confirmation on record."""
    confirmed: dict[str, int] = field(default_factory=dict)
    """Backend runs by who confirmed their spend."""


@dataclass
class Verdict:
    """One session's sweep, as it is left for the sweep of the run."""

    worker: str
    leaks: Leaks
    conduct: Conduct

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(data["worker"], Leaks(**data["leaks"]), Conduct(**data["conduct"]))


# --- one session ----------------------------------------------------------------------------------


def search_for_tokens(sweep: Sweep, *, prefect: bool) -> Leaks:
    """Search this session's texts, its Prefect server (if ``prefect``) and its Prefect homes."""
    places: dict[str, list[str]] = {TEXTS: [text for _, text in sweep.texts]}
    if prefect:
        places.update(asyncio.run(what_prefect_answers()))
    leaks = count_tokens(places, sweep.canaries)
    for path in prefect_home_files():
        data = path.read_bytes()
        leaks.found[f"file {path.name}"] = len(re.findall(TOKEN_SHAPE.pattern.encode(), data))
        leaks.files += 1
        leaks.file_bytes += len(data)
    leaks.found = {place: count for place, count in leaks.found.items() if count}
    return leaks


def count_tokens(places: dict[str, list[str]], canaries: set[str]) -> Leaks:
    """Count the canaries, and anything shaped like a token, in the texts of each place."""
    found: Counter[str] = Counter()
    for place, texts in places.items():
        for text in texts:
            found[place] += sum(c in text for c in canaries) + len(TOKEN_SHAPE.findall(text))
    return Leaks(
        canaries=len(canaries),
        texts={place: len(texts) for place, texts in places.items()},
        found={place: count for place, count in found.items() if count},
    )


async def what_prefect_answers() -> dict[str, list[str]]:
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


def prefect_home_files() -> list[Path]:
    """Every file under this session's Prefect homes: the client's and the server's."""
    homes = {Path(os.environ["PREFECT_HOME"]), Path(os.environ["PREFECT_HOME"]).parent / "server"}
    return [path for home in homes for path in home.rglob("*") if path.is_file()]


def check_conduct(sweep: Sweep) -> Conduct:
    """Match every request against the contract, every recorded decision against its principal."""
    routes = _contract_routes()
    requests = sweep.requests
    decisions = [(run.run_id, record) for run in sweep.runs for record in run.decisions]
    return Conduct(
        requests=len(requests),
        outside=[f"{e.method} {e.path}" for e in requests if not _in_contract(e, routes)],
        decisions=len(decisions),
        # v0.5: a decision is a person's, signed in at the backend; whatever a client or Prefect
        # said, the record names who decided.
        impersonal=[
            f"{run_id}/{record.action_id} {record.principal}"
            for run_id, record in decisions
            if not (record.principal or "").startswith(PERSON_PRINCIPAL_PREFIX)
        ],
        # Every run any simulator of the suite made must carry who confirmed its spend.
        runs=len(sweep.runs),
        unconfirmed=[run.run_id for run in sweep.runs if run.confirmation is None],
        confirmed=dict(Counter(run.confirmation.via for run in sweep.runs if run.confirmation)),
    )


def _contract_routes() -> list[tuple[str, re.Pattern[str]]]:
    document = json.loads(OPENAPI.read_text(encoding="utf-8"))
    routes = []
    for template, operations in document["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}/]+\}", "[^/]+", template) + "$")
        routes += [(method.upper(), pattern) for method in operations]
    # The pages a person opens from a quote's `confirm_url`, an action's `decide_url` and a
    # device login's `verification_uri`: the contract names them by link, not in OpenAPI.
    for page in PERSON_PAGES:
        routes += [(method, re.compile(f"^{re.escape(page)}$")) for method in ("GET", "POST")]
    return routes


def _in_contract(entry: Any, routes: list[tuple[str, re.Pattern[str]]]) -> bool:
    return any(entry.method == method and pattern.match(entry.path) for method, pattern in routes)


# --- the sessions of the run ----------------------------------------------------------------------


def this_worker() -> str:
    """Return this session's pytest-xdist worker id, or ``""`` when the run is one process."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def other_workers() -> list[str]:
    """Return the ids of the run's other pytest-xdist workers."""
    if not this_worker():
        return []
    count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    return [f"gw{index}" for index in range(count) if f"gw{index}" != this_worker()]


def _verdict_path(worker: str) -> Path:
    return Path(os.environ["PREFECT_ITO_TEST_RUN_DIRECTORY"]) / f"sweep-{worker}.json"


def publish(verdict: Verdict) -> None:
    """Leave this session's verdict for the sweep of the run (written whole, then renamed)."""
    path = _verdict_path(verdict.worker)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(verdict)), encoding="utf-8")
    partial.replace(path)


def published(worker: str) -> bool:
    return _verdict_path(worker).exists()


def wait_for_other_workers(timeout: float = WAIT_FOR_WORKERS) -> list[Verdict]:
    """Wait until every other worker of the run has swept its session; return their verdicts.

    A worker sweeps once its last test is done; the module of the sweep comes last in the run, so
    every worker but this one is on its last tests already.
    """
    deadline = time.monotonic() + timeout
    waiting = other_workers()
    while any(not published(worker) for worker in waiting):
        if time.monotonic() > deadline:
            missing = [worker for worker in waiting if not published(worker)]
            raise AssertionError(f"workers {missing} left no sweep within {timeout:.0f} s")
        time.sleep(1)
    return [
        Verdict.from_json(json.loads(_verdict_path(worker).read_text(encoding="utf-8")))
        for worker in waiting
    ]


def where(worker: str, place: str) -> str:
    """Name a place of a worker's session (plainly, when the run is one process)."""
    return f"{worker}: {place}" if worker else place
