"""The questions a backend puts to a person about a run, one module per kind (see ``registry``).

Importing the package registers every kind this version knows.
"""

from prefect_ito.questions import deadline, restart
from prefect_ito.questions.registry import (
    ActionQuestion,
    by_prefix,
    question_for,
    register,
    registered,
)

__all__ = [
    "ActionQuestion",
    "by_prefix",
    "deadline",
    "question_for",
    "register",
    "registered",
    "restart",
]
