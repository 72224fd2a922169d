"""Client references: stored on the run, found without a retention limit, never reused."""

from __future__ import annotations

import time

from prefect_ito.simulator import builtin_scenario

REFERENCE = "9b7c8f9e-4f0a-4d6e-8c1b-2a3d4e5f6a7b"


def _forgetful(desk_for, seconds: float = 0.5):
    scenario = builtin_scenario("default").model_copy(
        update={"idempotency_key_retention_seconds": seconds}
    )
    return desk_for(scenario)


def _body(desk, reference, **changes):
    """Return a submission body carrying ``reference`` (outside the manifest digest)."""
    return {**desk.body(**changes), "client_reference": reference}


def _find(desk, **params):
    response = desk.http.get("/v0/training-runs", params=params)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_capabilities_advertise_the_lookup(desk):
    capabilities = desk.http.get("/v0/capabilities").json()["data"]

    assert capabilities["client_reference"] is True


def test_the_reference_is_on_the_run_and_finds_it_after_its_key_expired(desk_for):
    desk = _forgetful(desk_for)
    run = desk.finished(desk.start(_body(desk, REFERENCE), key="k-ref"))
    # Its key was kept before that answer came: a busy machine may have taken long to give it,
    # so the key's age is counted from here (not from before the submission).
    time.sleep(0.6)

    by_key = _find(desk, idempotency_key="k-ref")
    by_reference = _find(desk, client_reference=REFERENCE)

    assert run["client_reference"] == REFERENCE
    assert by_key["runs"] == []  # the key is forgotten ...
    assert [r["run_id"] for r in by_reference["runs"]] == [run["run_id"]]  # ... the reference not
    assert by_reference["runs"][0]["client_reference"] == REFERENCE
    assert by_reference["runs"][0]["request"]["client_reference"] is None


def test_a_second_submission_with_the_reference_is_refused_naming_the_run(desk_for):
    desk = _forgetful(desk_for)
    run = desk.finished(desk.start(_body(desk, REFERENCE), key="k-first"))
    # Its key was kept before that answer came: a busy machine may have taken long to give it,
    # so the key's age is counted from here (not from before the submission).
    time.sleep(0.6)

    again = desk.submit(_body(desk, REFERENCE), key="k-second")
    other = desk.submit(_body(desk, REFERENCE, target="code"), key="k-third")

    for refused in (again, other):
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "CLIENT_REFERENCE_IN_USE"
        assert error["field"] == "client_reference"
        assert run["run_id"] in error["message"]
        assert error["details"] == {"run_id": run["run_id"]}
    assert len(desk.sim.runs()) == 1


def test_the_refusal_uses_no_quote(desk):
    first = desk.finished(desk.start(_body(desk, REFERENCE), key="k-1"))
    body = desk.confirmed(_body(desk, REFERENCE))

    refused = desk.submit(body, key="k-2")
    without_reference = desk.submit({**body, "client_reference": None}, key="k-3")

    assert refused.json()["error"]["code"] == "CLIENT_REFERENCE_IN_USE"
    assert without_reference.status_code == 201, without_reference.text
    assert without_reference.json()["data"]["run"]["run_id"] != first["run_id"]


def test_a_replay_by_key_or_by_the_unfinished_run_is_still_a_replay(desk_for):
    # Slow enough that the run is unfinished at the second submission on a busy machine too
    # (a scenario's own time_scale gives way to desk_for's, the suite's FAST, unless given here).
    desk = desk_for("default", time_scale=1_000)
    run = desk.start(_body(desk, REFERENCE), key="k-1")

    by_key = desk.submit(_body(desk, REFERENCE), key="k-1")
    by_booking = desk.submit(_body(desk, REFERENCE), key="k-2")

    for replay in (by_key, by_booking):
        assert replay.status_code == 200, replay.text
        assert replay.json()["data"]["run"]["run_id"] == run["run_id"]


def test_the_filter_pages_and_combines_with_the_others(desk):
    mine = desk.finished(desk.start(_body(desk, "ref-a"), key="k-a"))
    desk.finished(desk.start(_body(desk, "ref-b"), key="k-b"))
    desk.finished(desk.start(desk.body(), key="k-c"))

    page = _find(desk, client_reference="ref-a", limit=1)
    elsewhere = _find(desk, client_reference="ref-a", booking_id="bk-other")
    active = _find(desk, client_reference="ref-a", active="true")
    unknown = _find(desk, client_reference="ref-z")

    assert [r["run_id"] for r in page["runs"]] == [mine["run_id"]] and page["next"] is None
    assert elsewhere["runs"] == [] and active["runs"] == [] and unknown["runs"] == []


def test_another_accounts_reference_is_neither_found_nor_in_use(desk):
    desk.finished(desk.start(_body(desk, REFERENCE), key="k-1"))
    other = desk.sim.mint_token("another-account").get_secret_value()
    headers = {"Authorization": f"Bearer {other}"}

    found = desk.http.get(
        "/v0/training-runs", params={"client_reference": REFERENCE}, headers=headers
    )

    assert found.json()["data"]["runs"] == []


def test_a_malformed_reference_is_a_validation_error(desk):
    for bad in ("", "has space", "x" * 129, "tab\there", "é"):
        submitted = desk.submit(_body(desk, bad), key="k-bad", confirm=False)
        listed = desk.http.get("/v0/training-runs", params={"client_reference": bad})

        assert submitted.status_code == 422, bad
        assert submitted.json()["error"]["field"] == "client_reference", submitted.text
        assert listed.status_code == 422, bad


def test_an_older_backend_neither_advertises_nor_takes_references(desk_for):
    desk = desk_for(builtin_scenario("default").model_copy(update={"client_reference": False}))

    capabilities = desk.http.get("/v0/capabilities").json()["data"]
    refused = desk.submit(_body(desk, REFERENCE), key="k-1")

    assert capabilities["client_reference"] is False
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "client_reference"
