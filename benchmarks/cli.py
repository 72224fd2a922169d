"""How long a ``prefect-ito`` command takes to answer, start to exit, beside ``prefect --help``.

Each command runs as a person runs it, a fresh interpreter (``python -m prefect_ito.cli``), with
no Prefect server configured, against the reference simulator on loopback (in its own process).
The commands take turns, round after round, so drift on a shared machine hits them alike;
``prefect --help`` is the reference: what importing Prefect alone costs here.

Targets: ``--help`` within 0.5 s; ``quote --json``, ``whoami``, ``capabilities`` and
``runs show`` within 0.8 s (medians). Writes the ``cli`` section of ``benchmarks/results.json``
(the other sections are kept); figures go to ``docs/benchmarks.md``.
Run: ``uv run python benchmarks/cli.py`` (about a minute); ``BENCH_ROUNDS`` (default 10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bench import BOOKING, RemoteSimulator, machine, scenario, summarise, table

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
RESULTS = Path(__file__).with_name("results.json")
PREFECT_ITO = [sys.executable, "-m", "prefect_ito.cli"]
REQUEST = [
    "--booking", BOOKING, "--model-size", "8B", "--data", "catalog://ito/web-2026-10",
    "--target", "code-assistant", "--budget-usd", "250000",
]  # fmt: skip
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "prefect --help": ([sys.executable, "-m", "prefect", "--help"], None),
    "prefect-ito --help": ([*PREFECT_ITO, "--help"], 0.5),
    "prefect-ito quote --json": ([*PREFECT_ITO, "quote", *REQUEST, "--json"], 0.8),
    "prefect-ito whoami": ([*PREFECT_ITO, "whoami"], 0.8),
    "prefect-ito capabilities": ([*PREFECT_ITO, "capabilities"], 0.8),
    "prefect-ito runs show --booking": ([*PREFECT_ITO, "runs", "show", "--booking", BOOKING], 0.8),
}
"""Each command, and its target median in seconds (None: the reference)."""


def time_once(command: list[str], env: dict[str, str]) -> float:
    """Run ``command`` to its end; return the wall-clock seconds it took. It must succeed."""
    started = time.perf_counter()
    result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{command} failed: {result.stderr.decode(errors='replace')}")
    return elapsed


def measure(env: dict[str, str]) -> dict[str, list[float]]:
    """Return each command's timings: one a round, all commands in every round."""
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(ROUNDS):
        for name, (command, _target) in COMMANDS.items():
            samples[name].append(time_once(command, env))
    return samples


def command_env(sim: RemoteSimulator) -> dict[str, str]:
    """The shell of a person logged in to the simulator, with no Prefect server configured."""
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(ITO_COMPUTE_API_URL=sim.url, ITO_COMPUTE_TOKEN=sim.mint_token())
    return env


def main() -> None:
    with RemoteSimulator(scenario(time_scale=1.0)) as sim:
        env = command_env(sim)
        for command, _target in COMMANDS.values():  # compile and warm the file cache first
            time_once(command, env)
        samples = measure(env)
    rows, section = [], {}
    for name, (_command, target) in COMMANDS.items():
        summary = summarise(samples[name])
        met = "reference" if target is None else ("yes" if summary.median <= target else "NO")
        shown = "—" if target is None else f"≤ {target:.1f}"
        rows.append([name, f"{summary.median:.2f}", f"{summary.p90:.2f}", shown, met])
        section[name] = {"median_s": round(summary.median, 3), "p90_s": round(summary.p90, 3)}
    print(table(["command", "median s", "p90 s", "target s", "met"], rows))
    print(f"{ROUNDS} rounds; {machine()}")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["cli"] = section
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
