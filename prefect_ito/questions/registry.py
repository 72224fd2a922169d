"""The kinds of question a backend puts to a person about a run, each registered once.

Every kind is one :class:`Question`: a spend to confirm (:mod:`~prefect_ito.questions.spend`, a
quote) or a pending action's. What ``inbox``, the terminal, the watcher and notifications need of
any question — its name, its pause-key prefix, the record a flow writes beside its pause, what the
Prefect form can do and the command that answers it — comes from that object, found by the flow
run's pause key (:func:`asked_by`).

A backend holds a run and asks a person through a pending action (contract v0.5: decided at the
backend, by a signed-in person). Each kind the contract defines is one :class:`ActionQuestion`,
registered here by the module that describes it (:mod:`~prefect_ito.questions.restart`,
:mod:`~prefect_ito.questions.deadline`): what the Prefect form, the notifications, ``inbox``,
``status``, the cards, the terminal and ``prefect-ito decide`` say of it comes from that one
object, and every one of them looks it up by the action's kind (:func:`question_for`).

Adding a kind is the contract's :class:`~prefect_ito.contract.ActionKind` value and the fields it
requires, its pause-key prefix (:data:`~prefect_ito.waiting.keys.ACTION_PREFIXES`), one module
here registered in this package's ``__init__``, and the simulator's scenario for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Literal, TypeVar
from uuid import UUID

from prefect_ito.contract import ActionKind, DecisionChoice, PendingAction, TrainingRun
from prefect_ito.questions.commands import decide_command
from prefect_ito.waiting.keys import ACTION_PREFIXES, action_pause_key

if TYPE_CHECKING:
    from prefect_ito.waiting.waits import WaitRecord

__all__ = [
    "KINDS",
    "ActionQuestion",
    "Kind",
    "Question",
    "asked_by",
    "by_prefix",
    "question_for",
    "questions",
    "register",
    "registered",
]

Kind = Literal["spend", "restart", "deadline"]
"""Every kind of question put to a person: a spend to confirm (a quote), or a pending action's
(its question's :attr:`ActionQuestion.name`). Read back from Prefect, a record's kind is one of
these or it is not shown."""
KINDS: tuple[Kind, ...] = ("spend", "restart", "deadline")


class Question(ABC):
    """One kind of question put to a person, and what every place that shows or reads one
    needs of it, whatever the backend asks it about (a quote, a pending action)."""

    name: ClassVar[Kind]
    """A short name: the kind in notifications' payloads, ``inbox`` and ``--json``."""
    form_does: ClassVar[str]
    """What the flow run's Prefect form can do, as a parenthesis after its link: a person
    answers at the backend, never in Prefect."""

    @property
    @abstractmethod
    def pause_prefix(self) -> str:
        """The pause-key prefix of a flow run waiting on this kind."""

    @property
    @abstractmethod
    def record(self) -> type[WaitRecord]:
        """The record a flow writes beside its pause: what the watcher and ``inbox`` read back."""

    @abstractmethod
    def command(self, flow_run_id: UUID | str, recorded: str | None) -> str | None:
        """Return the command that answers the question, built here, never copied from what a
        flow run's record (``recorded``, anyone's to write) says; None when it cannot be."""


class ActionQuestion(Question):
    """One kind of pending action, and everything prefect-ito says of it to people.

    Every text is plain (no markdown) unless its name says otherwise; a backend's words in it
    are escaped by the caller that renders markdown.
    """

    kind: ClassVar[ActionKind]
    form_does: ClassVar[str] = (
        " (its form only rechecks once decided at the backend: a person decides on the "
        "backend's page, which the form names, or with the command below)"
    )
    noun: ClassVar[str]
    """What a person has to do, after "waits for": "a restart to decide"."""
    subject: ClassVar[str]
    """What is decided, after "approved"/"rejected": "the restart"."""
    label: ClassVar[str]
    """What is proposed, counted: "1 restart proposed", "2 deadline extensions proposed"."""

    @property
    def pause_prefix(self) -> str:
        """The pause-key prefix of a flow run waiting on this kind."""
        return ACTION_PREFIXES[self.kind]

    @property
    def record(self) -> type[WaitRecord]:
        # Imported when asked: the records read Prefect, and commands that only show a question
        # (``confirm``, ``runs show``) never import Prefect.
        from prefect_ito.waiting.waits import ActionWait

        return ActionWait

    def command(self, flow_run_id: UUID | str, recorded: str | None) -> str:
        return decide_command(flow_run_id)

    def pause_key(self, action: PendingAction) -> str:
        """Return the pause key a flow run waits under for ``action``."""
        return action_pause_key(self.kind, action.action_id)

    @abstractmethod
    def heading(self, action: PendingAction) -> str:
        """Return the form's heading, as markdown."""

    @abstractmethod
    def situation(self, run: TrainingRun, action: PendingAction) -> str:
        """Return, as markdown, why the backend holds the run and what it proposes."""

    @abstractmethod
    def rows(self, run: TrainingRun, action: PendingAction) -> list[tuple[str, str]]:
        """Return the evidence as (name, markdown value) rows, short enough for the form."""

    def chart(self, run: TrainingRun, action: PendingAction) -> str | None:
        """Return a chart for the form, as a markdown image; None for none."""
        return None

    @abstractmethod
    def choices(self, action: PendingAction) -> dict[DecisionChoice, str]:
        """Return what each decision does, as markdown: one sentence each."""

    @abstractmethod
    def asked(self, run: TrainingRun, action: PendingAction) -> str:
        """Return what is asked, in one line."""

    @abstractmethod
    def evidence(self, action: PendingAction) -> str:
        """Return the evidence, in one line."""

    @abstractmethod
    def numbers(self, action: PendingAction) -> dict[str, float]:
        """Return the evidence's numbers, for notifications and ``inbox --json``."""

    @abstractmethod
    def facts(self, action: PendingAction) -> list[tuple[str, str]]:
        """Return what was proposed as (name, plain text) rows, for the decisions card and view."""

    @abstractmethod
    def status(self, action: PendingAction) -> str:
        """Return the pending question in one line, for ``status`` and the progress card."""

    @abstractmethod
    def outcome(self, decision: DecisionChoice, action: PendingAction | None) -> str:
        """Return what a decision did, in a few words (``action`` unknown: only the decision)."""

    @abstractmethod
    def waiting(self, action: PendingAction) -> str:
        """Return the log line's start when the flow begins to wait (before where to decide)."""

    def asks(self, action: PendingAction) -> str:
        """Return what the flow run's paused state says it waits for."""
        return f"approve or reject {self.subject} at the backend"


_REGISTERED: dict[ActionKind, ActionQuestion] = {}
_BY_NAME: dict[Kind, Question] = {}


_Q = TypeVar("_Q", bound=Question)


def register(question: _Q) -> _Q:
    """Register the question of one kind (a pending action's kind, or the spend); return it."""
    if question.name in _BY_NAME:
        raise ValueError(f"{question.name} is registered already")
    if isinstance(question, ActionQuestion):
        _REGISTERED[question.kind] = question
    _BY_NAME[question.name] = question
    return question


def question_for(action: PendingAction | ActionKind | None) -> ActionQuestion | None:
    """Return the question of an action's kind; None for a kind this version does not know."""
    kind = action.kind if isinstance(action, PendingAction) else action
    return _REGISTERED.get(kind) if kind is not None else None


def registered() -> dict[ActionKind, ActionQuestion]:
    """Return every registered question, by kind."""
    return dict(_REGISTERED)


def questions() -> dict[Kind, Question]:
    """Return every registered question, the spend's included, by name."""
    return dict(_BY_NAME)


def asked_by(pause_key: str | None) -> Question | None:
    """Return the question a flow run paused under ``pause_key`` asks; None for another pause."""
    return next(
        (q for q in _BY_NAME.values() if pause_key and pause_key.startswith(q.pause_prefix)),
        None,
    )


def by_prefix(pause_key: str | None) -> ActionQuestion | None:
    """Return the pending action's question whose flow runs wait under ``pause_key``; None for
    another pause (a spend's included)."""
    asked = asked_by(pause_key)
    return asked if isinstance(asked, ActionQuestion) else None
