"""Where a command's CPU goes, by kind of process: a profile of the test suite's run.

    uv run python benchmarks/suite_cpu.py                  # profiles `uv run pytest`
    uv run python benchmarks/suite_cpu.py -- bash .ci/run  # or any command
    uv run python benchmarks/suite_cpu.py --processes cpu.tsv -- ...  # and every process seen

The suite starts hundreds of processes (Prefect servers, workers, flow runs, the CLI, Chromium),
so a profiler inside pytest sees little of it. This samples ``/proc`` twice a second instead:
every process descended from the command, its command line and its CPU time (user + system) as
last seen, and the whole machine's busy share over the run. A process that lives less than half
a second may be missed, and one that is killed loses up to half a second of its count: the
figures are a floor. Linux only.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")
INTERVAL = 0.5
KINDS: list[tuple[str, str]] = [
    (r"chromium|chrome", "Chromium (the browser tests)"),
    (r"postgres", "PostgreSQL"),
    (r"prefect server start", "Prefect servers (the tests')"),
    (r"uvicorn", "Prefect servers (the CLI's temporary ones)"),
    (r"prefect worker start", "Prefect workers"),
    (r"prefect\.runner|prefect\.engine|prefect/engine", "flow runs a worker started"),
    (r"prefect_ito\.cli watch", "prefect-ito watch"),
    (r"prefect_ito\.cli|prefect-ito", "prefect-ito CLI commands"),
    (r"prefect .*deploy", "prefect deploy"),
    (r"exec\(eval\(sys\.stdin", "pytest-xdist workers (tests, in-process flows, simulators)"),
    (r"pytest", "pytest (the run's own process)"),
    (r"mypy|ruff", "mypy and ruff"),
    (r"\buv\b|pip", "uv and pip"),
    (r"python", "other Python"),
]


@dataclass
class Seen:
    command: str
    cpu: float


def kind(command: str) -> str:
    """Return the kind of a process, by its command line."""
    return next((label for pattern, label in KINDS if re.search(pattern, command)), "other")


def read_stat(pid: str) -> tuple[int, float, int] | None:
    """Return (parent pid, CPU seconds, start tick) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def command_line(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def machine_busy() -> tuple[int, int]:
    """Return (busy, total) jiffies of the whole machine since boot."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    return sum(values) - idle, sum(values)


@dataclass
class Run:
    code: int
    seen: dict[tuple[str, int], Seen]
    wall: float
    busy: float
    """The whole machine's busy share over the run."""
    waited_cpu: float
    """CPU seconds the kernel counts for the command and every descendant a parent waited for:
    a cross-check on the sampled sum, which misses short processes."""


def profile(command: list[str]) -> Run:
    """Run ``command``, sampling its process tree."""
    busy0, total0 = machine_busy()
    started = time.monotonic()
    process = subprocess.Popen(command)
    tree = {process.pid}
    seen: dict[tuple[str, int], Seen] = {}
    while process.poll() is None:
        for pid in (name for name in os.listdir("/proc") if name.isdigit()):
            stat = read_stat(pid)
            if stat is None:
                continue
            parent, cpu, start = stat
            if int(pid) not in tree and parent not in tree:
                continue
            tree.add(int(pid))
            key = (pid, start)
            if key in seen:
                seen[key].cpu = cpu
            else:
                seen[key] = Seen(command_line(pid), cpu)
        time.sleep(INTERVAL)
    wall = time.monotonic() - started
    busy1, total1 = machine_busy()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Run(
        process.returncode,
        seen,
        wall,
        (busy1 - busy0) / max(1, total1 - total0),
        children.ru_utime + children.ru_stime,
    )


def report(run: Run) -> str:
    cpu: dict[str, float] = {}
    count: Counter[str] = Counter()
    for entry in run.seen.values():
        cpu[kind(entry.command)] = cpu.get(kind(entry.command), 0.0) + entry.cpu
        count[kind(entry.command)] += 1
    total = sum(cpu.values())
    lines = [
        "| processes of this kind | CPU s | share | how many |",
        "|---|---:|---:|---:|",
        *(
            f"| {label} | {seconds:,.0f} | {seconds / total:.0%} | {count[label]} |"
            for label, seconds in sorted(cpu.items(), key=lambda item: -item[1])
        ),
        f"| **all** | **{total:,.0f}** | | **{sum(count.values())}** |",
        "",
        f"Wall time {run.wall:,.0f} s on {os.cpu_count()} cores "
        f"({run.wall * (os.cpu_count() or 1):,.0f} core-seconds). Sampled, the command's "
        f"processes used {total:,.0f} CPU s; the kernel counts {run.waited_cpu:,.0f} for the "
        f"command and the descendants waited for. The whole machine was busy {run.busy:.0%} "
        "of the time.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="*", default=["uv", "run", "pytest"])
    parser.add_argument(
        "--processes", metavar="FILE", help="also write each process seen: CPU s, tab, command"
    )
    args = parser.parse_args()
    run = profile(args.command)
    print(report(run))
    if args.processes:
        with open(args.processes, "w") as listing:
            for entry in sorted(run.seen.values(), key=lambda entry: -entry.cpu):
                listing.write(f"{entry.cpu:.2f}\t{entry.command}\n")
    return run.code


if __name__ == "__main__":
    sys.exit(main())
