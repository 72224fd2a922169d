"""Every key prefect-ito writes on a flow run — pause keys and flow-run input keys — in one place.

Prefect keys a pause's answer and any other flow-run input by a string. Who reads what goes by
these prefixes: the watcher resumes only ``defer-`` pauses on its own, and answers a ``spend-``
pause or a pending action's (``restart-``, ``deadline-``: :data:`ACTION_PREFIXES`) only with a
recheck once the backend says a person answered there. The records
and claims beside them (``ito-…``) are never pause keys, so nobody can answer one.
"""

from __future__ import annotations

import re

from prefect_ito.contract import ActionKind

__all__ = [
    "ACTION_PREFIXES",
    "ACTION_RECORD_PREFIX",
    "BACKEND_RUN_KEY",
    "DEFER_PREFIX",
    "QUESTION_RECORD_PREFIX",
    "QUOTE_RECORD_PREFIX",
    "RECOVERY_PREFIX",
    "RESTART_PREFIX",
    "RESUME_PREFIX",
    "SPEND_PREFIX",
    "action_pause_key",
    "is_action_pause",
    "spend_pause_key",
]

DEFER_PREFIX = "defer-"
"""Pause keys (and their records' input keys) of deferred runs start with this; no other pause's
do, so a watcher never touches a run that waits for a person."""

SPEND_PREFIX = "spend-"
"""Pause keys of spend questions start with this."""

RESTART_PREFIX = "restart-"
"""Pause keys of restart decisions start with this."""

ACTION_PREFIXES: dict[ActionKind, str] = {
    ActionKind.LOSS_SPIKE_RESTART: RESTART_PREFIX,
    ActionKind.DEADLINE_EXTENSION: "deadline-",
}
"""The pause-key prefix of each kind of pending action a person decides at the backend."""


def spend_pause_key(manifest_digest: str) -> str:
    """Return the pause key for confirming a manifest: stable across re-entries of a flow run."""
    return SPEND_PREFIX + manifest_digest.removeprefix("sha256:")[:16]


def action_pause_key(kind: ActionKind, action_id: str) -> str:
    """Return the pause key for a decision on a pending action: stable across re-entries,
    letters, digits and dashes."""
    return ACTION_PREFIXES[kind] + re.sub(r"[^a-zA-Z0-9-]+", "-", action_id).strip("-").lower()


def is_action_pause(key: str | None) -> bool:
    """Tell whether a pause key is a question about a pending action, of any kind."""
    return key is not None and key.startswith(tuple(ACTION_PREFIXES.values()))


BACKEND_RUN_KEY = "ito-backend-run"
"""The flow-run input that records the backend run a flow run supervises, once it has one."""

QUOTE_RECORD_PREFIX = "ito-quote-"
"""Input keys of the records of quotes a flow run waits on a person for."""

ACTION_RECORD_PREFIX = "ito-action-"
"""Input keys of the records of backend runs' pending actions a flow run waits on a person for."""

QUESTION_RECORD_PREFIX = "ito-question-"
"""Input keys of the records of questions put to a person (what ``prefect-ito inbox`` shows):
displayed only, never acted on."""

RECOVERY_PREFIX = "ito-recovery-"
"""Input keys of a watcher's claims to re-enter a flow run whose process was lost."""

RESUME_PREFIX = "ito-resume-"
"""Input keys of a watcher's claims to resume a suspended flow run."""
