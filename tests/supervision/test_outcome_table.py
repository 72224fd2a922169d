"""One table of outcomes: the error classes, the client's mapping and the docs are made from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefect_ito import exceptions as exc
from prefect_ito.contract import ErrorCode
from prefect_ito.exceptions import ExitCode, ItoError
from prefect_ito.outcomes import (
    BY_NAME,
    CLI_DOC,
    COMPLETED,
    ERROR_STATUS,
    OUTCOMES,
    exit_code_table,
    with_exit_code_table,
)

ERROR_CLASSES = [
    getattr(exc, name)
    for name in exc.__all__
    if isinstance(getattr(exc, name), type) and issubclass(getattr(exc, name), ItoError)
]
FLOWS_DOC = Path(__file__).parents[2] / "docs" / "flows.md"


def test_every_subclass_of_ito_error_is_public() -> None:
    def subclasses(cls: type) -> set[type]:
        found = set(cls.__subclasses__())
        return found.union(*(subclasses(sub) for sub in found))

    defined_here = {cls for cls in subclasses(ItoError) if cls.__module__ == exc.__name__}
    assert defined_here <= set(ERROR_CLASSES)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_class_states_its_code_state_and_exit_code(cls: type[ItoError]) -> None:
    # Stated on the class itself, never inherited by accident: a new class must have a row.
    for attribute in ("code", "state_name", "exit_code"):
        assert attribute in vars(cls), f"{cls.__name__} does not state its {attribute}"
    assert re.fullmatch(r"[A-Z][A-Z_]*", cls.code)
    assert re.fullmatch(r"[A-Z][A-Za-z]*", cls.state_name)
    assert isinstance(cls.exit_code, ExitCode)


def test_each_class_is_a_row_and_each_row_a_class() -> None:
    assert sorted(cls.__name__ for cls in ERROR_CLASSES) == sorted(BY_NAME)
    for cls in ERROR_CLASSES:
        row = BY_NAME[cls.__name__]
        assert (cls.code, cls.state_name, cls.exit_code) == (
            row.code,
            row.state_name,
            row.exit_code,
        )
        assert cls.__module__ == exc.__name__
        assert cls.__doc__


def test_a_code_and_a_class_name_are_one_row_each() -> None:
    codes, names = {row.code for row in OUTCOMES}, {row.name for row in OUTCOMES}
    assert len(codes) == len(names) == len(OUTCOMES)


def test_a_state_name_means_one_exit_code() -> None:
    seen: dict[str, ExitCode] = {}
    for row in OUTCOMES:
        assert seen.setdefault(row.state_name, row.exit_code) is row.exit_code, row.name


def test_every_exit_code_but_success_has_an_outcome() -> None:
    used = {row.exit_code for row in OUTCOMES}
    assert used == set(ExitCode) - {ExitCode.SUCCESS}


def test_the_rows_with_a_status_are_the_contract_codes_the_client_maps() -> None:
    # Every code the contract names has its HTTP status, and its class is an ItoAPIError.
    assert set(ERROR_STATUS) == set(ErrorCode)
    for row in OUTCOMES:
        error = exc.error_from_envelope(row.code, "safe words", status_code=400)
        if row.status is None:
            # prefect-ito's own codes are no backend's: a backend sending one is not trusted.
            assert type(error) is exc.ItoAPIError, row.name
        else:
            assert type(error) is getattr(exc, row.name)
            assert isinstance(error, exc.ItoAPIError)
        assert (error.code, error.message) == (row.code, "safe words")


def test_an_error_raised_without_a_message_says_its_outcome() -> None:
    assert str(exc.SpendDeclined()) == "a person declined the spend: nothing was submitted"
    assert str(exc.BookingBusy()) == (
        "[BOOKING_BUSY] the booking already has an unfinished run with a different manifest"
    )
    assert exc.RunCancelled(run_id="run-1").message == "the run was cancelled"
    assert exc.BookingBusy.__doc__ == (
        "The booking already has an unfinished run with a different manifest."
    )


def test_messages_are_plain_phrases() -> None:
    for row in OUTCOMES:
        assert row.message == row.message.strip(), row.name
        assert not row.message.endswith("."), row.name


def _documented_states() -> dict[str, int]:
    """Return the final-state table of docs/flows.md: state name → exit code."""
    text = FLOWS_DOC.read_text()
    section = text.split("## Final states", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (?:\w+|—) \| .* \| (\d+) \|$", section, re.M)
    return {name: int(code) for name, code in rows}


def test_the_flows_docs_table_is_the_outcome_table() -> None:
    documented = _documented_states()
    from_table = {row.state_name: int(row.exit_code) for row in OUTCOMES}
    from_table[COMPLETED] = int(ExitCode.SUCCESS)
    assert documented == from_table


def test_the_cli_docs_exit_code_table_is_generated_from_the_outcome_table() -> None:
    committed = CLI_DOC.read_text(encoding="utf-8")
    assert committed == with_exit_code_table(committed), (
        "the exit-code table of docs/cli.md differs from prefect_ito/outcomes.py: "
        "run `uv run python -m prefect_ito.outcomes`"
    )


def test_the_check_sees_a_table_edited_by_hand() -> None:
    committed = CLI_DOC.read_text(encoding="utf-8")
    edited = committed.replace("| 9 | `NOT_FOUND` | `NotFound` |", "| 9 | `NOT_FOUND` | `Gone` |")
    assert edited != committed
    assert with_exit_code_table(edited) == committed
    with pytest.raises(ValueError, match="markers"):
        with_exit_code_table("no table here")


def test_the_table_has_one_row_per_exit_code() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", exit_code_table(), re.M)
    assert [(int(code), name) for code, name in rows] == [(int(c), c.name) for c in ExitCode]
