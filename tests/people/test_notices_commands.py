"""The command a question names is a usage line: every way of answering it spells runs."""

from __future__ import annotations

import itertools
import uuid

import pytest

from prefect_ito.cli import app
from prefect_ito.people.notices import confirm_command, decide_command

SAMPLE = {"TEXT": "the spike was a blip", "NAME": "Ada"}
"""What a person puts in for each placeholder."""


def spelled_out(usage: str) -> list[list[str]]:
    """Return every command line ``usage`` stands for: ``a|b`` is either, ``[x]`` is optional."""
    choices: list[list[list[str]]] = []
    for word in usage.split():
        if word.startswith("[") and word.endswith("]"):
            choices.append([[], [word[1:-1]]])
        else:
            choices.append(
                [[SAMPLE.get(alternative, alternative)] for alternative in word.split("|")]
            )
    return [list(itertools.chain(*picked)) for picked in itertools.product(*choices)]


@pytest.mark.parametrize(
    "usage",
    [decide_command(uuid.uuid4()), confirm_command("quote_9f2c")],
    ids=["restart", "spend"],
)
def test_every_answer_a_question_names_is_a_command_prefect_ito_takes(usage: str):
    lines = spelled_out(usage)
    assert len(lines) == 2  # approve or reject; confirm or decline
    for line in lines:
        assert line[0] == "prefect-ito"
        app.parse_args(line[1:], exit_on_error=False, print_error=False)  # raises if it is not
