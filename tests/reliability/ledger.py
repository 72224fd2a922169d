"""The reliability ledger: what each trial measured, and the report written from it.

Tests record figures through the ``ledger`` fixture (see ``conftest.py``): how many trials of a
category ran, which faults were injected how often, the outcomes, the duplicates and leaks found
(counted from the simulator's own state and request log, never from the client's view), and
named measures such as how long a ``Retry-After`` was waited out. Every figure comes from a
measurement in this run; nothing in the report is written by hand.

``pytest tests/reliability --reliability-report docs/reliability.md`` renders the figures of the
run into that Markdown file and keeps them beside it as JSON (``docs/reliability.json``). A
category this run did not measure keeps the figures an earlier run recorded there, with that
run's machine and command, so trials that run elsewhere (the crash and watcher trials against a
real Prefect server and worker) add their categories to the same report.
"""

from __future__ import annotations

import json
import platform
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["CATEGORIES", "Figures", "Ledger", "Provenance", "render"]

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
}
"""The categories of the report, in its order (the issue's numbering)."""


@dataclass
class Provenance:
    """Where and how figures were measured."""

    machine: str
    command: str
    date: str

    @classmethod
    def here(cls, command: str, cpus: int | None) -> Provenance:
        """Return the provenance of figures measured now, on this machine."""
        machine = (
            f"{platform.system()} {platform.machine()}, {cpus or '?'} CPUs, "
            f"Python {platform.python_version()}"
        )
        return cls(machine=machine, command=command, date=datetime.now(UTC).strftime("%Y-%m-%d"))


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
        "These figures come from `tests/reliability`, a fault-injection and bad-input suite that "
        "runs with every `uv run pytest`. Each trial drives prefect-ito against the reference "
        "simulator (on a loopback port) and, where flows run, the test session's Prefect server. "
        "Duplicates are counted from the simulator's own runs and request log, never from what the "
        "client believes; leaks are searched for in every place the suite can read. This page is "
        "generated — regenerate it, with the figures of your machine, by running:",
        "",
        "```sh",
        "uv run pytest tests/reliability --reliability-report docs/reliability.md",
        "```",
        "",
        f"The figures are also kept as JSON in `{json_name}`. A category a run does not measure "
        "keeps the figures of the run that did, with that run's machine and command.",
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
    for name, title in CATEGORIES.items():
        if name in figures:
            lines += ["", *_section(title, figures[name])]
    return "\n".join(lines) + "\n"


def _section(title: str, figures: Figures) -> list[str]:
    lines = [f"## {title}", ""]
    if figures.measures:
        lines += ["| measure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in figures.measures.items()]
        lines.append("")
    lines.append("Measured by " + ", ".join(f"`{test}`" for test in figures.tests) + ".")
    if figures.provenance is not None:
        p = figures.provenance
        lines += ["", f"On {p.machine}, {p.date}, with `{p.command}`."]
    return lines
