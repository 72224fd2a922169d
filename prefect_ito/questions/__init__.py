"""The questions a backend puts to a person about a run, one module per kind (see ``registry``).

Importing the package registers every kind this version knows.
"""

from prefect_ito.questions import deadline, restart, spend
from prefect_ito.questions.registry import (
    ActionQuestion,
    Question,
    asked_by,
    by_prefix,
    question_for,
    questions,
    register,
    registered,
)

__all__ = [
    "ActionQuestion",
    "Question",
    "asked_by",
    "by_prefix",
    "deadline",
    "question_for",
    "questions",
    "register",
    "registered",
    "restart",
    "spend",
]
