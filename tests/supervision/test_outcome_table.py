"""Every public error states its Prefect state name and exit code, and the docs agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefect_ito import exceptions as exc
from prefect_ito.exceptions import ExitCode, ItoError

ERROR_CLASSES = [
    getattr(exc, name)
    for name in exc.__all__
    if isinstance(getattr(exc, name), type) and issubclass(getattr(exc, name), ItoError)
]
FLOWS_DOC = Path(__file__).parents[2] / "docs" / "flows.md"
CLI_DOC = Path(__file__).parents[2] / "docs" / "cli.md"


def test_every_subclass_of_ito_error_is_public() -> None:
    def subclasses(cls: type) -> set[type]:
        found = set(cls.__subclasses__())
        return found.union(*(subclasses(sub) for sub in found))

    defined_here = {cls for cls in subclasses(ItoError) if cls.__module__ == exc.__name__}
    assert defined_here <= set(ERROR_CLASSES)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_class_states_its_code_state_and_exit_code(cls: type[ItoError]) -> None:
    # Stated on the class itself, never inherited by accident: a new class must decide.
    for attribute in ("code", "state_name", "exit_code"):
        assert attribute in vars(cls), f"{cls.__name__} does not state its {attribute}"
    assert re.fullmatch(r"[A-Z][A-Z_]*", cls.code)
    assert re.fullmatch(r"[A-Z][A-Za-z]*", cls.state_name)
    assert isinstance(cls.exit_code, ExitCode)


def test_a_state_name_means_one_exit_code() -> None:
    seen: dict[str, ExitCode] = {}
    for cls in ERROR_CLASSES:
        assert seen.setdefault(cls.state_name, cls.exit_code) is cls.exit_code, cls.__name__


def _documented_states() -> dict[str, int]:
    """Return the final-state table of docs/flows.md: state name → exit code."""
    text = FLOWS_DOC.read_text()
    section = text.split("## Final states", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (?:\w+|—) \| .* \| (\d+) \|$", section, re.M)
    return {name: int(code) for name, code in rows}


def test_the_docs_table_is_the_classes_table() -> None:
    documented = _documented_states()
    from_classes = {cls.state_name: int(cls.exit_code) for cls in ERROR_CLASSES}
    from_classes["Completed"] = int(ExitCode.SUCCESS)
    assert documented == from_classes


def _documented_exit_codes() -> dict[int, tuple[str, set[str], set[str]]]:
    """Return the exit-code table of docs/cli.md: code → (ExitCode name, states, error codes)."""
    section = CLI_DOC.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.*) \| (.*) \|$", section, re.M)

    def names(cell: str) -> set[str]:
        return set(re.findall(r"`(\w+)`", cell))

    return {int(code): (name, names(states), names(codes)) for code, name, states, codes in rows}


def test_the_cli_docs_have_one_row_per_exit_code_with_its_states_and_error_codes() -> None:
    expected = {
        int(code): (
            code.name,
            {cls.state_name for cls in [*ERROR_CLASSES, ItoError] if cls.exit_code is code},
            {cls.code for cls in [*ERROR_CLASSES, ItoError] if cls.exit_code is code},
        )
        for code in ExitCode
    }
    expected[int(ExitCode.SUCCESS)] = ("SUCCESS", {"Completed"}, set())

    assert _documented_exit_codes() == expected
