"""What each card says: progress, gates, telemetry and decisions, for finished and waiting runs."""

from __future__ import annotations

import re

from played_runs import play
from rich.console import Console

from prefect_ito.cli.views import print_summary
from prefect_ito.contract import DecisionChoice
from prefect_ito.reporting import cards
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting import report as reporting
from prefect_ito.reporting.decisions import decisions
from prefect_ito.reporting.report import TrainingSummary, artifact_key


def test_the_telemetry_card_shows_a_chart_and_no_wall_of_points():
    run, seen = play("demo", decide="approve")
    text = cards.telemetry_markdown(run, seen)

    assert "![Training loss by step](data:image/svg+xml;base64," in text
    assert "Points:" not in text and "▁" not in text
    assert "Spike 17.28 at step 12,000: approved: the run restarted from step 10,000." in text
    assert "| spend | $" in text and "of the ceiling" in text


def test_a_finished_run_without_interruptions_says_none_not_none_so_far():
    finished, _ = play("default")
    waiting, _ = play("loss-spike", decide=None)

    assert "### Interruptions\n\nNone.\n" in cards.telemetry_markdown(finished)
    assert "None so far." in cards.telemetry_markdown(waiting)


def test_the_progress_of_a_finished_run_says_how_it_ended_not_what_runs_now():
    finished, _ = play("default")
    waiting, _ = play("loss-spike", decide=None)

    assert cards.progress_percent(finished) == 100.0
    assert cards.progress_description(finished) == (
        "Succeeded: 8 of 8 stages done, 6 of 6 gates passed."
    )
    assert "now" not in cards.progress_description(finished).lower()
    assert cards.progress_description(waiting) == (
        "pretrain waits for a decision; 2 of 8 stages done, 0 of 6 gates passed; "
        f"next: {md.text('mid_train')}."
    )


def test_the_progress_card_says_more_than_a_percentage():
    # Before: "Progress: 100%" and a count of stages; not the gates passed, what runs next, or
    # where a run that did not succeed stopped.
    failed, _ = play("gate-failure")

    assert cards.progress_description(failed) == (
        f"Gate failed: 4 of 8 stages done, 1 of 6 gates passed; stopped in {md.text('mid_train')}."
    )


def test_the_decisions_card_records_who_how_why_when_and_the_checkpoint():
    run, seen = play("demo", decide="approve", reason="bad shard 7")
    text = cards.decisions_markdown(run, seen)

    (decision,) = run.decisions
    assert "1 restart proposed: 1 approved." in text
    # No empty header row: the decision heads its table.
    assert (
        "### 1. Approved by user\\:acct\n\n"
        "| decision | **approved: the run restarted from step 10,000** |\n|---|---|\n"
    ) in text
    assert "| | |" not in text
    # Who decided is whom the backend authenticated; the typed name is only a note (v0.5).
    assert "| decided by | `user:acct` |" in text
    assert "| note | Ada |" in text
    assert f"| decided at | {cards.when(decision.decided_at)} |" in text
    assert "| why | bad shard 7 |" in text
    # What was proposed, as the restart's question says it (prefect_ito.questions.restart).
    assert f"| loss spike | {md.text('17.28 at step 12,000 in pretrain')} |" in text
    assert f"| restart checkpoint | {md.text('ckpt-pretrain-10000 (step 10,000)')} |" in text


def test_a_pending_decision_and_no_decision_at_all_are_said_plainly():
    waiting, _ = play("loss-spike", decide=None)
    finished, _ = play("default")

    assert "**awaiting a person**" in cards.decisions_markdown(waiting)
    assert "Nothing was proposed: nothing needed a person's decision." in (
        cards.decisions_markdown(finished)
    )


def test_a_decision_taken_before_this_supervisor_attached_still_shows():
    run, _ = play("demo", decide="reject", reason="a | pipe\nand a newline")
    text = cards.decisions_markdown(run, {})

    # The backend's record names no kind: only the decision is said.
    assert "| decision | **rejected** |" in text
    assert "a \\| pipe and a newline" in text
    assert "proposed before this supervisor attached" in text


def test_timestamps_read_as_dates_people_use():
    run, seen = play("demo", decide="approve")
    row = decisions(run, seen)[0]

    assert cards.when(row.proposed_at).startswith("2026-12-")  # days into the run, not 2035
    assert cards.when(row.proposed_at).endswith(" UTC")


def test_the_decisions_card_and_the_terminal_keep_to_the_wall_clock():
    # Before: "proposed at 2026-12-13 17:09" (the simulated run's compressed clock) beside
    # "decided at 2026-12-05 00:36" (the wall clock), neither labelled.
    run, seen = play("demo", decide="approve")
    row = decisions(run, seen)[0]
    assert row.held_since is not None and row.decided_at is not None
    assert cards.when(row.proposed_at) != cards.when(row.held_since)  # two clocks, really

    text = cards.decisions_markdown(run, seen)
    console = Console(record=True, width=200)
    print_summary(console, TrainingSummary.of(run, actions=seen))
    printed = console.export_text()

    for shown in (text, printed):
        assert cards.when(row.held_since) in shown and cards.when(row.decided_at) in shown
        assert cards.when(row.proposed_at) not in shown, shown
    assert f"| asked at | {cards.when(row.held_since)} |" in text
    # Asked, then decided: before, "asked at" came last, after the decision and its evidence.
    for shown in (text, printed):
        assert shown.index("asked at") < shown.index("decided at") < shown.index("loss spike")
    # Without the wall clock's moment, the run's own is shown under a label that says so.
    unheld = {key: action.model_copy(update={"held_since": None}) for key, action in seen.items()}
    text = cards.decisions_markdown(run, unheld)
    assert f"| proposed at (the run's clock) | {cards.when(row.proposed_at)} |" in text


def test_the_status_line_of_a_pending_action_keeps_to_the_wall_clock():
    run, _ = play("loss-spike", decide=None)
    action = run.pending_action
    assert action is not None and action.held_since is not None

    line = reporting.status_facts(run)["pending_decision"]

    assert line.endswith(f"proposed, asked at {cards.when(action.held_since)}"), line


def test_the_summary_carries_every_decision_with_its_checkpoint():
    run, seen = play("demo", decide="approve")
    summary = TrainingSummary.of(run, actions=seen)

    (decision,) = summary.decisions
    assert decision.decision is DecisionChoice.APPROVE
    assert (decision.decided_by, decision.checkpoint_id) == ("Ada", "ckpt-pretrain-10000")
    assert decision.checkpoint_step == 10_000 and decision.step == 12_000
    assert decision.principal == "user:acct"


def test_a_decision_from_a_backend_that_names_no_principal_says_so_plainly():
    run, seen = play("demo", decide="approve")
    older = run.model_copy(
        update={"decisions": [d.model_copy(update={"principal": None}) for d in run.decisions]}
    )

    text = cards.decisions_markdown(older, seen)
    assert "| decided by | Ada (a name; the backend authenticated nobody) |" in text
    assert "| note |" not in text


def test_the_terminal_summary_shows_who_was_authenticated_and_the_typed_note():
    run, seen = play("demo", decide="approve")
    console = Console(record=True, width=120)

    print_summary(console, TrainingSummary.of(run, actions=seen))

    text = console.export_text()
    assert re.search(r"decided by\s+│ user:acct", text), text
    assert re.search(r"note\s+│ Ada", text), text


def test_one_card_per_concern_and_status_facts_on_the_progress_card():
    finished, seen = play("demo", decide="approve")
    assert [card.key for card in reporting.cards(finished, seen)] == [
        artifact_key(finished.run_id, kind)
        for kind in ("progress", "gates", "telemetry", "decisions")
    ]

    waiting, seen = play("demo", decide=None)
    found = reporting.cards(waiting, seen)
    # No gate has results before pretrain ends: no gates card yet.
    assert [card.key.split("-")[1] for card in found] == ["progress", "telemetry", "decisions"]
    facts = found[0].metadata
    assert facts["run_id"] == waiting.run_id and facts["stage"] == "pretrain"
    assert "of $250,000.00" in facts["spend"]
    assert "restart from ckpt-pretrain-10000 (step 10,000)" in facts["pending_decision"]
    assert all(len(value) <= 500 for value in facts.values())  # Prefect cuts longer values
    # Before: the key "forecast" held "forecast: $…", read "forecast: forecast: $…".
    assert (
        facts["forecast"].startswith("$")
        and "at completion of $250,000 budget" in facts["forecast"]
    )


def test_text_from_people_and_the_backend_is_printed_as_text_at_the_terminal():
    # Rich reads "[...]" in a string as markup: a reason like this became a live terminal link.
    hostile = "[link=http://evil.example]click[/link] [bold red]urgent[/]"
    run, _ = play("demo", decide="approve", reason=hostile)
    console = Console(record=True, width=400, force_terminal=True)

    print_summary(console, TrainingSummary.of(run))

    assert hostile in console.export_text()
    assert "evil.example" not in "".join(
        str(segment.style.link) for segment in console._record_buffer if segment.style
    )


def test_a_parked_progress_card_opens_on_nothing_to_do_and_the_next_report_drops_it():
    run, _ = play("default")
    parked, *others = reporting.cards(run, parked=True)
    plain, *same = reporting.cards(run)

    assert parked.description == f"{reporting.PARKED_LINE} {plain.description}"
    assert "Parked" not in plain.description
    assert parked.fingerprint() != plain.fingerprint()  # so the next publish replaces it
    assert others == same  # only the progress card says it
