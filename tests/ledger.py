"""The reliability ledger: what each trial measured, and the report written from it.

Tests record figures through the ``ledger`` fixture (see ``conftest.py``): how many trials of a
category ran, which faults were injected how often, the outcomes, the duplicates and leaks found
(counted from the simulator's own state and request log, never from the client's view), and
named measures such as how long a ``Retry-After`` was waited out. Every figure comes from a
measurement in this run; nothing in the report is written by hand.

``pytest -n 0 tests/reliability tests/e2e/test_crashes.py --reliability-report docs/reliability.md``
renders the figures of the run into that Markdown file and keeps them beside it as JSON
(``docs/reliability.json``). The crash and watcher trials against a real Prefect server and worker
record theirs in the same ledger. A category a run did not measure keeps the figures an earlier
run recorded there, with that run's machine and command.
"""

from __future__ import annotations

import json
import platform
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "METHODS",
    "Figures",
    "Ledger",
    "Provenance",
    "read_figures",
    "render",
    "write_figures",
]

CATEGORIES: dict[str, str] = {
    "lost-answers": "Lost answers and timeouts after sending",
    "storms": "503 and 429 storms",
    "crashes": "Crashes of the supervising process",
    "watcher": "Watcher faults",
    "revocation": "A credential revoked mid-run",
    "bad-input": "Bad input",
    "malformed-answers": "Malformed backend answers",
    "secrets": "Secrets (canary tokens)",
    "never-alone": "Never acts on its own",
    "spend-attempts": "Spend attempts without a person's confirmation at the backend",
    "follow-cancel-attempts": "Follow and cancel attempts through Prefect records",
    "decision-attempts": "Decisions attempted without a person's sign-in at the backend",
}
"""The categories of the report, in its order."""
REPORT_PATHS = "tests/reliability tests/e2e/test_crashes.py"
"""The tests that measure every category: what the report's command runs."""
METHODS: dict[str, str] = {
    "lost-answers": "Fifty logical submissions, decisions and cancels each lose their answer after "
    "the backend committed them, and fifty time out after sending while the backend still holds "
    "the write in flight; flow runs lose, or time out on, their submission's answer. Duplicates "
    "are the runs, decisions, `cancel_requested` events and uses of a spend confirmation beyond "
    "one per logical write, counted in the simulator (a submission carries its confirmation, so "
    "every resend relays it again).",
    "storms": "30 % of answers are `503` and 10 % are `429` with `Retry-After: 1`. Many callers "
    "of one process share its retry budget; callers of their own each retry alone, and the wait "
    "after each `429` is timed; whole pipelines (a loss spike a person decides, post-training "
    "through RLVR) run in the storm, as flows and as `ItoTrainingJob`s outside any flow. A call "
    "that gives up in the storm ends as `BackendUnavailable`; a final `409` is never sent again. "
    "The simulator decides each fault by the seed and the request, so a seeded storm repeats; "
    "a submission is retried by the client alone, and one that gives up has made no run.",
    "crashes": "Training flow runs of the shipped deployment, all at once on their own real "
    "Prefect server, process worker and two watchers (`tests/e2e/test_crashes.py`): each is "
    "struck at a seeded point (its flow process SIGKILLed before submission, right after it, "
    "mid-gate or as it reads a person's decision; a watcher SIGKILLed while it is deferred; "
    "a person answering only after the machine loss and the server restart while it waits), the "
    "machine is lost once (the worker and every flow process SIGKILLed) and the Prefect server "
    "restarted once. Duplicates are backend runs beyond one per trial and decisions beyond one "
    "per action (the simulator's records and request log) and gate events Prefect holds twice "
    "(any two copies of one backend event, by id).",
    "watcher": "The same trials: a watcher is SIGKILLed and started again while another runs "
    "beside it, and the Prefect server is restarted mid-run. Resumes lost and doubled are "
    "counted from Prefect's state history of every suspension.",
    "revocation": "The token is revoked at the backend while a flow long-polls its run; the "
    "simulator's request log shows every request after the revocation.",
    "bad-input": "Flow parameters, command-line options, block fields and scenario files, from "
    "tables and from hypothesis: each refusal names its field, comes with exit code 2, and no "
    "request reaches the simulator. Unusual but valid text (shell metacharacters, any script) "
    "reaches the backend byte for byte.",
    "malformed-answers": "A tap between the client and the simulator rewrites answers while a "
    "run is supervised. Fuzzed bodies are fed to the response parser by "
    "`tests/backend/test_parser_fuzz.py`.",
    "secrets": "Every token of the suite is a canary, searched for (with anything shaped like a "
    "simulator token) in every test's captured output and log records, command output, state and "
    "exception texts, Prefect's API (block documents with secrets, logs, flow and task runs, "
    "artifacts, events) and every byte of the files under the session's Prefect homes.",
    "never-alone": "Every request any simulator of the suite answered is matched against the "
    "endpoints of the OpenAPI document and the pages a person opens from its links, and every "
    "decision any simulator recorded against the principal it names (a person's, since v0.5).",
    "spend-attempts": "A seeded generator picks, for each attempt, a route and its parameters: "
    "over HTTP with the worker's token (training scopes only, no person's principal) against a "
    "simulator, and as whole `ito-training` flow runs for the routes through Prefect (inline "
    "authorizations, forged blocks, answers written before the question, Resume, the form, "
    "the `credentials` parameter). Runs created are counted from the simulator's own records, "
    "leaving out the setup runs a person made; the controls, where a person did confirm at the "
    "backend or made a covering authorization, must make exactly one run each.",
    "follow-cancel-attempts": "A colleague's backend run trains on the simulator, made by a real "
    "submission whose client reference is the colleague's flow run id. A seeded generator builds "
    "decoy flow runs that name it every way Prefect lets anyone write: a `run_id` parameter, the "
    "colleague's exact `training` request or another, the colleague's idempotency key copied, "
    "inline credentials; each is cancelled (`cancel_supervised_run`), and some go through the "
    "real `ito-cancel-training` flow on a real Prefect server with a forged `ito-backend-run` "
    "record, held as `Cancelled` or `Cancelling`, or left `Running` (a forged `Cancelled` "
    "event). Follow attempts ask `find_attachable_run` with a record naming the colleague's run, "
    "naming a run of another booking or a made-up one, and on the booking the colleague's run "
    "keeps busy. Other runs touched are cancel requests for, and follows of, any run the decoy's "
    "own submission did not make, counted from the simulator's runs and request log. Controls: "
    "a decoy's own run is cancelled and followed; a decoy with the colleague's key and exact "
    "request is the same submission, and follows that run by design.",
    "decision-attempts": "A colleague's run waits on the simulator for a decision on a "
    "loss-spike restart. A seeded generator builds each attempt without a person's sign-in at "
    "the backend: the decision route with the workload's token (approve or reject, any typed "
    "name, a fresh or the colleague's idempotency key, the pending action or a made-up one) or "
    "another account's person's token; the decide page with no sign-in, a wrong passphrase, an "
    "account name alone, a foreign Origin or Referer, no or a replayed CSRF token, another "
    "account's person; and through Prefect, a forged approval and a forged recheck on a flow run "
    "paused on the restart. Decisions recorded are counted from the simulator's runs; the "
    "control, the colleague's person signed in on the decide page, must record exactly one.",
}
"""How each category is measured, for the report."""


@dataclass
class Provenance:
    """Where and how figures were measured."""

    machine: str
    command: str
    date: str
    run: str = ""
    """How long the run took, and how busy the machine was."""

    @classmethod
    def here(cls, command: str, cpus: int | None, run: str) -> Provenance:
        """Return the provenance of figures measured now, on this machine."""
        machine = (
            f"{platform.system()} {platform.machine()}, {cpus or '?'} CPUs, "
            f"Python {platform.python_version()}"
        )
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        return cls(machine=machine, command=command, date=date, run=run)


@dataclass
class Figures:
    """The figures of one category, summed over the tests that recorded them."""

    trials: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    leaks: int = 0
    measures: dict[str, str] = field(default_factory=dict)
    tests: list[str] = field(default_factory=list)
    provenance: Provenance | None = None

    def add(
        self,
        test: str,
        *,
        trials: int,
        faults: dict[str, int] | None,
        outcomes: dict[str, int] | None,
        duplicates: int,
        leaks: int,
        measures: dict[str, str] | None,
    ) -> None:
        """Add one test's figures."""
        self.trials += trials
        self.faults.update(faults or {})
        self.outcomes.update(outcomes or {})
        self.duplicates += duplicates
        self.leaks += leaks
        self.measures.update(measures or {})
        if test not in self.tests:
            self.tests.append(test)

    def to_json(self) -> dict[str, Any]:
        """Return the figures as plain JSON."""
        return {
            "trials": self.trials,
            "faults": dict(self.faults),
            "outcomes": dict(self.outcomes),
            "duplicates": self.duplicates,
            "leaks": self.leaks,
            "measures": self.measures,
            "tests": self.tests,
            "provenance": vars(self.provenance) if self.provenance else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figures:
        """Return the figures :meth:`to_json` wrote."""
        provenance = data.get("provenance")
        return cls(
            trials=data["trials"],
            faults=Counter(data["faults"]),
            outcomes=Counter(data["outcomes"]),
            duplicates=data["duplicates"],
            leaks=data["leaks"],
            measures=dict(data["measures"]),
            tests=list(data["tests"]),
            provenance=Provenance(**provenance) if provenance else None,
        )


class Ledger:
    """Every figure the tests of one session recorded, by category."""

    def __init__(self) -> None:
        self.categories: dict[str, Figures] = {}

    def record(
        self,
        category: str,
        test: str,
        *,
        trials: int,
        faults: dict[str, int] | None = None,
        outcomes: dict[str, int] | None = None,
        duplicates: int = 0,
        leaks: int = 0,
        measures: dict[str, str] | None = None,
    ) -> None:
        """Record what one test measured in ``category`` (one of :data:`CATEGORIES`)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown reliability category {category!r}")
        counts = {"trials": trials, "duplicates": duplicates, "leaks": leaks}
        counts.update(
            (f"{kind} {name!r}", n)
            for kind, given in (("fault", faults), ("outcome", outcomes))
            for name, n in (given or {}).items()
        )
        if negative := [name for name, n in counts.items() if n < 0]:
            raise ValueError(f"{test} counted below zero: {', '.join(negative)}")
        figures = self.categories.setdefault(category, Figures())
        figures.add(
            test,
            trials=trials,
            faults=faults,
            outcomes=outcomes,
            duplicates=duplicates,
            leaks=leaks,
            measures=measures,
        )

    def stamp(self, provenance: Provenance) -> None:
        """Say where and how every figure of this session was measured."""
        for figures in self.categories.values():
            figures.provenance = provenance

    def merged_over(self, earlier: dict[str, Figures]) -> dict[str, Figures]:
        """Return this session's figures, and an earlier run's for categories it did not measure."""
        return {**earlier, **self.categories}


def read_figures(path: Path) -> dict[str, Figures]:
    """Return the figures kept in ``path`` (JSON), or none if there is no such file."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {name: Figures.from_json(data) for name, data in raw.items()}


def write_figures(path: Path, figures: dict[str, Figures]) -> None:
    """Keep ``figures`` in ``path`` as JSON, in the report's order."""
    ordered = {name: figures[name].to_json() for name in CATEGORIES if name in figures}
    path.write_text(json.dumps(ordered, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(counter.items())) or "—"


def render(figures: dict[str, Figures], json_name: str) -> str:
    """Return the Markdown report of ``figures``."""
    lines = [
        "# Reliability and security, in figures",
        "",
        "These figures come from `tests/reliability`, a fault-injection and bad-input suite, and "
        "from the crash trials of `tests/e2e/test_crashes.py`; both run with every "
        "`uv run pytest`, which plays a share of the same seeded trials (every route and phase "
        "still at least once: `tests/trial_counts.py`), while a run with `--reliability-report` "
        "plays them all. Each trial drives prefect-ito against the reference simulator (on a "
        "loopback port) and, where flows run, a real Prefect server (the crash trials: their own "
        "server, process worker and watchers). "
        "Duplicates are counted from the simulator's own runs and request log, never from what the "
        "client believes; leaks are searched for in every place the suite can read. This page is "
        "generated — regenerate it, with the figures of your machine, by running:",
        "",
        "```sh",
        f"uv run pytest -n 0 {REPORT_PATHS} --reliability-report docs/reliability.md",
        "```",
        "",
        f"The figures are also kept as JSON in `{json_name}`. A category a run does not measure "
        "keeps the figures of the run that did, with that run's machine and command; tests "
        "record figures through the suite's `ledger` fixture (see `tests/ledger.py`).",
        "",
        "| category | trials | faults injected | outcomes | duplicates | leaks |",
        "|---|---:|---|---|---:|---:|",
    ]
    for name, title in CATEGORIES.items():
        if name not in figures:
            lines.append(f"| {title} | not measured | | | | |")
            continue
        f = figures[name]
        lines.append(
            f"| {title} | {f.trials} | {_counts(f.faults)} | {_counts(f.outcomes)} "
            f"| {f.duplicates} | {f.leaks} |"
        )
    for name in CATEGORIES:
        if name in figures:
            lines += ["", *_section(name, figures[name])]
    return "\n".join(lines) + "\n"


def _section(name: str, figures: Figures) -> list[str]:
    lines = [f"## {CATEGORIES[name]}", "", METHODS[name], ""]
    if figures.measures:
        lines += ["| measure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in figures.measures.items()]
        lines.append("")
    lines.append("Measured by " + ", ".join(f"`{test}`" for test in figures.tests) + ".")
    if figures.provenance is not None:
        p = figures.provenance
        took = f" ({p.run})" if p.run else ""
        lines += ["", f"On {p.machine}, {p.date}, with `{p.command}`{took}."]
    return lines
