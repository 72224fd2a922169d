"""Bad input, table-driven and property-based: refused naming the field, before any request.

Flow parameters, command-line options, block fields and scenario files: each bad value ends as
``InvalidParameters`` (exit code 2) with a message that starts with the field's name and repeats
at most a little of the value, and the simulator behind it never sees a request. Values that are
unusual but valid (shell metacharacters, any script of Unicode) reach the backend byte for byte:
nothing interprets them.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_kit import Backend, request_for

from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.cli import main
from prefect_ito.cli.simulator import resolve_scenario
from prefect_ito.contract import ID_MAX_LENGTH, MODEL_SIZE_PATTERN
from prefect_ito.exceptions import ExitCode, InvalidParameters
from prefect_ito.parameters import TrainingParameters

# The console script reads its arguments from sys.argv, which cyclopts remarks on under pytest.
pytestmark = pytest.mark.filterwarnings("ignore:Cyclopts application invoked without tokens")

VALID: dict[str, Any] = {
    "booking": "bk-h200-2x8-ib",
    "model_size": "8B",
    "data": ["catalog://ito/web-2026-10"],
    "target": "code-assistant",
    "budget_usd": 250_000.0,
}
LONGEST_MESSAGE = 200
"""A refusal repeats at most a little of a huge value."""
HUGE = "9" * 100_000

BAD_PARAMETERS: list[tuple[str, Any]] = [
    ("budget_usd", ""),
    ("budget_usd", "lots"),
    ("budget_usd", -1),
    ("budget_usd", 0),
    ("budget_usd", math.nan),
    ("budget_usd", math.inf),
    ("budget_usd", "-inf"),
    ("budget_usd", "1e400"),
    ("budget_usd", HUGE),
    ("budget_usd", True),
    ("budget_usd", None),
    ("model_size", ""),
    ("model_size", "8"),
    ("model_size", "8 B"),
    ("model_size", "-8B"),
    ("model_size", "0B"),
    ("model_size", "８B"),
    ("model_size", "8B; rm -rf /"),
    ("model_size", HUGE + "B"),
    ("post_training", "ppo"),
    ("post_training", "SFT"),
    ("post_training", ""),
    ("booking", ""),
    ("booking", "   "),
    ("booking", "b" * (ID_MAX_LENGTH + 1)),
    ("booking", "bk-1\n--budget-usd 1"),
    ("booking", "bk-\x1b[2J"),
    ("booking", "bk-\x00"),
    # Bidi overrides and zero-width characters make one id read as another.
    ("booking", "bk-\u202e1-kb"),
    ("booking", "bk\u200b-1"),
    ("data", ["s3://team/\u2066corpus\u2069/"]),
    ("target", "code\u200dassistant"),
    ("target", "chat\ufeff"),
    ("booking", 42),
    ("data", []),
    ("data", [""]),
    ("data", "catalog://x"),
    ("data", ["catalog://ok", "s3://bucket/\x07bell"]),
    ("data", ["s3://" + "x" * 600]),
    ("target", ""),
    ("target", "\t"),
    ("target", "code\rassistant"),
    ("idempotency_key", "two words"),
    ("idempotency_key", "k" * 256),
    ("idempotency_key", "ключ"),
    ("approval_timeout", 0),
    ("approval_timeout", "nan"),
    ("deadline", -1),
    ("stall_timeout", "inf"),
    ("gpus", 8),
]
VERBATIM: list[dict[str, Any]] = [
    # `?` and `\` stay out of the data reference: a standing authorization covers no reference
    # a store may resolve elsewhere (see contract.data_ref_ambiguity); they travel in the target.
    {"data": ["s3://corpus/$(rm -rf ~);`id`|&<>*'\""], "target": "code ?\\ assistant"},
    {"target": "assistant juridique — Zürich «été» 😀 中文 العربية"},
    {"data": ["s3://données/étiquetées/𝄞"], "target": "$HOME && echo pwned"},
]


def refusal(fields: dict[str, Any]) -> InvalidParameters:
    with pytest.raises(InvalidParameters) as refused:
        TrainingParameters.parse(fields)
    return refused.value


def named(error: InvalidParameters, field: str) -> bool:
    """Whether the refusal starts with the field's name and stays short."""
    text = str(error)
    return text.startswith(field) and len(text) <= LONGEST_MESSAGE and "\n" not in text


@pytest.mark.parametrize(("field", "value"), BAD_PARAMETERS)
def test_a_bad_flow_parameter_is_refused_naming_its_field(field, value, ledger):
    error = refusal({**VALID, field: value})

    ledger.record(
        "bad-input",
        trials=1,
        faults={"flow parameter": 1},
        outcomes={f"refused, exit {int(error.exit_code)}": 1},
    )
    assert error.exit_code == ExitCode.INVALID_INPUT
    assert named(error, field), str(error)


@pytest.mark.parametrize("changes", VERBATIM)
async def test_unusual_but_valid_text_reaches_the_backend_byte_for_byte(
    changes, backend, submit, ledger
):
    target: Backend = backend()
    parameters = TrainingParameters.parse({**VALID, **changes})
    request = request_for(
        VALID["booking"], data_refs=parameters.data, target=parameters.target, budget_usd=1e5
    )
    async with target.client() as client:
        await submit(client, request, "verbatim")

    (run,) = target.sim.runs()
    ledger.record(
        "bad-input", trials=1, faults={"unusual but valid text": 1}, outcomes={"sent verbatim": 1}
    )
    assert run.run.request.data_refs == parameters.data
    assert run.run.request.target == parameters.target
    assert run.run.manifest_digest == request.digest()


# --- property-based: whatever comes in, either a valid request or a refusal naming the field --

texts = st.text(max_size=200)
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
    st.lists(texts, max_size=4),
)
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parsed(fields: dict[str, Any]) -> TrainingParameters | InvalidParameters:
    """Return the parameters, or the refusal: nothing else may come out."""
    try:
        return TrainingParameters.parse(fields)
    except InvalidParameters as error:
        return error


def _valid_or_refused(field: str, fields: dict[str, Any]) -> TrainingParameters | None:
    parameters = parsed(fields)
    if isinstance(parameters, InvalidParameters):
        assert named(parameters, field), str(parameters)
        return None
    # What was accepted makes a request with a digest: nothing fails later for the same reason.
    claim_id = parameters.booking if isinstance(parameters.booking, str) else "bk-x"
    request = request_for(
        claim_id,
        model_size=parameters.model_size,
        data_refs=parameters.data,
        target=parameters.target,
        budget_usd=parameters.budget_usd,
    )
    assert request.digest().startswith("sha256:")
    return parameters


@PROPERTY
@given(value=st.one_of(anything, st.floats(max_value=0), st.sampled_from(["nan", "-0", "1e999"])))
def test_any_budget_is_accepted_only_finite_and_positive(value):
    parameters = _valid_or_refused("budget_usd", {**VALID, "budget_usd": value})
    if parameters is not None:
        assert math.isfinite(parameters.budget_usd) and parameters.budget_usd > 0


@PROPERTY
@given(value=st.one_of(anything, st.from_regex(MODEL_SIZE_PATTERN, fullmatch=True)))
def test_any_model_size_is_accepted_only_in_its_pattern(value):
    parameters = _valid_or_refused("model_size", {**VALID, "model_size": value})
    if parameters is not None:
        assert isinstance(value, str) and parameters.model_size == value


@PROPERTY
@given(value=st.one_of(anything, st.text(max_size=ID_MAX_LENGTH + 20)))
def test_any_booking_id_is_accepted_only_printable_and_short(value):
    parameters = _valid_or_refused("booking", {**VALID, "booking": value})
    if parameters is not None:
        booking = parameters.booking
        assert isinstance(booking, str) and 0 < len(booking) <= ID_MAX_LENGTH
        assert booking.isprintable() or not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in booking)


@PROPERTY
@given(value=st.one_of(anything, st.lists(st.text(max_size=600), max_size=6)))
def test_any_data_references_are_refused_or_kept_as_given(value):
    parameters = _valid_or_refused("data", {**VALID, "data": value})
    if parameters is not None:
        assert parameters.data == [ref.strip() for ref in value]


@PROPERTY
@given(fields=st.dictionaries(st.sampled_from([*VALID, "mode", "deadline", "x"]), anything))
def test_any_parameters_at_all_end_in_a_request_or_invalid_parameters(fields):
    outcome = parsed({**VALID, **fields})
    if isinstance(outcome, InvalidParameters):
        assert len(str(outcome)) <= LONGEST_MESSAGE * 2 and "\n" not in str(outcome)


# --- through the flow: refused before any request ---------------------------------------------


async def test_bad_parameters_end_the_flow_before_any_request(backend, run_training, ledger):
    target: Backend = backend()
    # The table above covers each rule; these are the ways in only a flow run has.
    cases = {
        "booking": {"booking": "bk-\x1b]0;pwned\x07"},
        "credentials.api_url": {"credentials": {"api_url": "ftp://desk.example.com"}},
        "booking.node_count": {"booking": {**_booking_block(), "node_count": 0}},
    }

    trainings = await asyncio.gather(*(run_training(target, **case) for case in cases.values()))

    states = [training.state for training in trainings]
    ledger.record(
        "bad-input",
        trials=len(cases),
        faults={"flow run parameter": len(cases)},
        outcomes=dict(Counter(f"refused, flow {state.name}" for state in states)),
    )
    for field, state in zip(cases, states, strict=True):
        assert state.name == "InvalidParameters", (field, state.name, state.message)
        assert (state.message or "").startswith(f"InvalidParameters: {field}"), state.message
    assert target.requests() == []


def _booking_block() -> dict[str, Any]:
    return ItoBooking(
        booking_id="bk-h200-2x8-ib", gpu_sku="H200", node_count=2, gpus_per_node=8, fabric="IB"
    ).model_dump(mode="json", exclude={"block_type_slug"})


# --- the command line, in this process: one line, exit code 2, nothing sent -------------------

TRAIN = ["train", "--booking", "bk-h200-2x8-ib", "--model-size", "8B", "--data", "catalog://x",
         "--target", "code-assistant"]  # fmt: skip
BAD_OPTIONS: list[tuple[list[str], str]] = [
    ([*TRAIN, "--budget-usd", "nan"], "budget_usd"),
    ([*TRAIN, "--budget-usd", "-inf"], "budget_usd"),
    ([*TRAIN, "--budget-usd", "0"], "budget_usd"),
    ([*TRAIN, "--budget-usd", HUGE], "budget_usd"),
    ([*TRAIN, "--budget-usd", "lots"], "budget"),
    ([*TRAIN, "--budget-usd", "1", "--post-training", "ppo"], "post_training"),
    ([*TRAIN[:3], "--model-size", "8 B", *TRAIN[5:], "--budget-usd", "1"], "model_size"),
    ([*TRAIN[:1], "--booking", "bk;\x1b[31mred", *TRAIN[3:], "--budget-usd", "1"], "booking"),
    ([*TRAIN[:1], "--booking", "b" * 200, *TRAIN[3:], "--budget-usd", "1"], "booking"),
    ([*TRAIN[:7], "--data", "s3://a\x00b", *TRAIN[7:], "--budget-usd", "1"], "data"),
    ([*TRAIN, "--budget-usd", "1", "--api-url", "ftp://desk"], "api_url"),
    ([*TRAIN, "--budget-usd", "1", "--idempotency-key", "a b"], "idempotency_key"),
    ([*TRAIN, "--budget-usd", "1", "--approval-timeout", "-5"], "approval_timeout"),
    # Before: read without bound (a /dev/zero ran the machine out of memory).
    ([*TRAIN, "--budget-usd", "1", "--data-file", "/dev/zero"], "data_file"),
]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str], sweep: Any) -> tuple[int, str]:
    """Run ``prefect-ito`` here, as its console script does; return its exit code and stderr."""
    saved = sys.argv
    sys.argv = ["prefect-ito", *args]
    try:
        with pytest.raises(SystemExit) as ended:
            main()
    finally:
        sys.argv = saved
    out, err = capsys.readouterr()
    sweep.text("cli stdout", out)
    sweep.text("cli stderr", err)
    return int(ended.value.code or 0), err


@pytest.fixture
def cli_backend(backend, monkeypatch) -> Backend:
    """A simulator the command line would talk to, with the token in the environment."""
    target: Backend = backend()
    monkeypatch.setenv(ENV_API_URL, target.url)
    monkeypatch.setenv(ENV_TOKEN, target.token.get_secret_value())
    return target


@pytest.mark.parametrize(("args", "field"), BAD_OPTIONS)
def test_a_bad_option_is_one_line_naming_it_and_sends_nothing(
    args, field, cli_backend, capsys, sweep, ledger
):
    code, err = run_cli(args, capsys, sweep)

    ledger.record(
        "bad-input",
        trials=1,
        faults={"command-line option": 1},
        outcomes={f"refused, exit {code}": 1},
    )
    assert code == ExitCode.INVALID_INPUT, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert field in err and "Traceback" not in err
    assert len(err) <= LONGEST_MESSAGE + 100
    assert cli_backend.requests() == []


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    budget=st.one_of(
        st.floats(max_value=0).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "1e999", "-0"]),
        st.text(alphabet="abcxyz$;|&`", min_size=1, max_size=30),
    )
)
def test_any_bad_budget_on_the_command_line_is_refused(budget, cli_backend, capsys, sweep):
    code, err = run_cli([*TRAIN, f"--budget-usd={budget}"], capsys, sweep)

    assert code == ExitCode.INVALID_INPUT, err
    assert "budget" in err and err.count("\n") == 1, err
    assert cli_backend.requests() == []


# --- scenario files -----------------------------------------------------------------------------

BAD_SCENARIOS: list[tuple[str, str, str]] = [
    ("not-yaml.yaml", "bookings: [unclosed\n", "not valid YAML"),
    ("not-json.json", '{"bookings": [', "not valid JSON"),
    ("list.yaml", "- 1\n- 2\n", "Input should be"),
    (
        "rate.yaml",
        "bookings: []\nrun: {curriculum: [], post_training: []}\nfaults: {unavailable_rate: 2}\n",
        "faults.unavailable_rate",
    ),
    (
        "stage.yaml",
        "bookings: []\nrun: {curriculum: [{name: warmup, hours: 1, steps: 1, "
        "loss_start: 1, loss_end: 1}], post_training: []}\n",
        "run.curriculum.0",
    ),
    ("typo.yaml", "bookings: []\nrun: {curriculum: [], post_training: []}\nfalts: {}\n", "falts"),
    ("binary.yaml", "\udcff\udcfe", "cannot be read"),
]


@pytest.mark.parametrize(("name", "content", "said"), BAD_SCENARIOS)
def test_a_bad_scenario_file_is_one_line_naming_the_file(
    name, content, said, tmp_path, capsys, sweep, ledger
):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape"))

    code, err = run_cli(["simulator", "--scenario", str(path), "--port", "0"], capsys, sweep)

    ledger.record(
        "bad-input", trials=1, faults={"scenario file": 1}, outcomes={f"refused, exit {code}": 1}
    )
    assert code == ExitCode.INVALID_INPUT, err
    assert err.startswith(f"error: scenario {path}: ") and err.count("\n") == 1, err
    assert said in err


@settings(max_examples=60, deadline=None)
@given(content=st.binary(max_size=300))
def test_any_scenario_file_loads_or_is_refused(content, tmp_path_factory):
    path = Path(tmp_path_factory.mktemp("scenario")) / "fuzz.yaml"
    path.write_bytes(content)
    try:
        resolve_scenario(str(path))
        refused = None
    except InvalidParameters as error:
        refused = str(error)
    assert refused is None or (refused.startswith(f"scenario {path}: ") and "\n" not in refused)


def test_a_credentials_block_with_a_bad_url_names_the_field(ledger):
    with pytest.raises(ValueError, match="api_url") as refused:
        ItoCredentials(api_url="javascript:alert(1)")

    ledger.record(
        "bad-input", trials=1, faults={"block field": 1}, outcomes={"refused naming the field": 1}
    )
    assert "not an http(s) URL" in str(refused.value)


# --- the services' numeric options: finite and positive, refused before anything starts -------

BAD_SERVICE_OPTIONS: list[tuple[list[str], str]] = [
    (["simulator", "--port", "0", "--time-scale", "-1"], "time_scale"),
    (["simulator", "--port", "0", "--time-scale", "0"], "time_scale"),
    (["simulator", "--port", "0", "--time-scale", "nan"], "time_scale"),
    (["simulator", "--port", "0", "--time-scale", "inf"], "time_scale"),
    (["watch", "--lost-after", "nan"], "lost_after"),
    (["watch", "--lost-after", "inf"], "lost_after"),
    (["watch", "--lost-after", "-1"], "lost_after"),
    (["watch", "--wait", "nan"], "wait"),
    (["watch", "--wait", "inf"], "wait"),
    (["watch", "--wait", "0"], "wait"),
    (["watch", "--max-concurrency", "0"], "max_concurrency"),
    (["watch", "--list-every", "nan"], "list_every"),
    (["watch", "--list-every", "0"], "list_every"),
]


@pytest.mark.parametrize(("args", "field"), BAD_SERVICE_OPTIONS)
def test_a_bad_service_option_is_one_line_naming_it(args, field, capsys, sweep, ledger):
    # Before, the simulator printed pydantic's traceback, and the watcher took nan and inf and
    # then failed every sweep.
    code, err = run_cli(args, capsys, sweep)

    ledger.record(
        "bad-input", trials=1, faults={"service option": 1}, outcomes={f"refused, exit {code}": 1}
    )
    assert code == ExitCode.INVALID_INPUT, err
    assert err.startswith(f"error: {field}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("field", ["time_scale", "quote_ttl_seconds"])
@pytest.mark.parametrize("value", [".inf", ".nan", "-1"])
def test_a_scenario_file_with_a_time_that_is_not_finite_is_refused(field, value, tmp_path):
    path = tmp_path / "clock.yaml"
    path.write_text(f"bookings: []\nrun: {{curriculum: [], post_training: []}}\n{field}: {value}\n")

    with pytest.raises(InvalidParameters, match=f"^scenario {path}: {field}"):
        resolve_scenario(str(path))


# --- ids that go into a URL path: checked here, before any request ----------------------------

BAD_IDS = ["", "   ", " run_1", "run/1", "..", ".", "run?x=1", "run#top", "run\x1b[2J",
           "r" * (ID_MAX_LENGTH + 1)]  # fmt: skip


@pytest.mark.parametrize("run_id", BAD_IDS)
@pytest.mark.parametrize("command", ["attach", "runs show"])
def test_a_bad_run_id_is_one_line_and_sends_nothing(
    command, run_id, cli_backend, prefect_server, capsys, sweep, ledger
):
    # Before, `attach ''` reached the backend (HTTP 307) and exited 1.
    code, err = run_cli([*command.split(), run_id], capsys, sweep)

    ledger.record(
        "bad-input", trials=1, faults={"run id": 1}, outcomes={f"refused, exit {code}": 1}
    )
    assert code == ExitCode.INVALID_INPUT, err
    assert err.startswith("error: run_id: ") and err.count("\n") == 1, err
    assert cli_backend.requests() == []


# --- a standing authorization stored with bad data: refused on load, naming the field ---------

BAD_AUTHORIZATIONS: list[tuple[dict[str, Any], str]] = [
    ({"authorization_id": ""}, "authorization.authorization_id"),
    ({"authorization_id": "sa/../everything"}, "authorization.authorization_id"),
    ({"authorization_id": 5}, "authorization.authorization_id"),
    # v0.3's inline limits, written into a saved block by anyone with Prefect API access.
    ({"authorized_by": "Ada Lovelace", "max_budget_usd": 1e12}, "authorization"),
]


async def store_bad_authorization(name: str, changes: dict[str, Any]) -> None:
    """Save a valid authorization as ``name``, then change its stored data past the model.

    Anyone with Prefect API access can write a block document (the REST API takes any data).
    """
    from prefect import get_client
    from prefect.client.schemas.actions import BlockDocumentUpdate

    from prefect_ito.blocks import ItoSpendAuthorization

    block_id = await ItoSpendAuthorization(authorization_id="sa_valid").asave(name, overwrite=True)
    async with get_client() as client:
        stored = await client.read_block_document(block_id)
        update = BlockDocumentUpdate(data={**stored.data, **changes}, merge_existing_data=False)
        await client.update_block_document(block_id, update)


@pytest.mark.parametrize(("changes", "field"), BAD_AUTHORIZATIONS)
async def test_a_stored_authorization_with_bad_data_fails_its_flow_run_naming_the_field(
    changes, field, backend, prefect_server, ledger
):
    # Before, loading it raised Prefect's RuntimeError: the flow run ended as a plain Failed.
    from prefect_ito.flows import ito_training

    target: Backend = backend()
    name = f"bad-authorization-{field.rsplit('.', 1)[-1].replace('_', '-')}-{len(changes)}"
    await store_bad_authorization(name, changes)

    state = await ito_training(
        training=TrainingParameters.parse(VALID),
        credentials=target.credentials(),
        authorization=name,
        return_state=True,
    )

    ledger.record(
        "bad-input",
        trials=1,
        faults={"stored block data": 1},
        outcomes={f"refused, flow {state.name}": 1},
    )
    assert state.name == "InvalidParameters", (state.name, state.message)
    assert (state.message or "").startswith(f"InvalidParameters: {field}"), state.message
    assert target.requests() == []


@pytest.mark.parametrize(("changes", "field"), BAD_AUTHORIZATIONS[:5])
def test_a_stored_authorization_with_bad_data_is_one_line_at_the_command_line(
    changes, field, cli_backend, prefect_server, capsys, sweep
):
    name = f"bad-cli-authorization-{len(field)}-{sorted(changes)[0]}".replace("_", "-")
    asyncio.run(store_bad_authorization(name, changes))

    code, err = run_cli([*TRAIN, "--budget-usd", "1000", "--authorization", name], capsys, sweep)

    assert code == ExitCode.INVALID_INPUT, err
    assert err.startswith(f"error: {field}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    # train reads the backend's capabilities before it starts Prefect (where the block is read):
    # that read, and nothing else, reached the backend.
    sent = {(entry.method, entry.path) for entry in cli_backend.requests()}
    assert sent <= {("GET", "/v0/capabilities")}, sent


@pytest.mark.parametrize(
    "url",
    [
        "https://desk.example.com/" + "a" * 70_000,
        "https://user:pw@desk.example.com/" + "b" * 5_000 + "?q=1",
    ],
    ids=["longer-than-httpx-takes", "with-a-user-and-a-query"],
)
def test_a_huge_backend_url_is_named_short_not_echoed(url, capsys, sweep):
    # Before: `whoami` echoed the whole 70,000-character URL in its one line.
    code, err = run_cli(["whoami", "--api-url", url], capsys, sweep)

    assert code != 0 and err.startswith("error: ") and err.count("\n") == 1, err[:200]
    assert len(err) <= LONGEST_MESSAGE + 100, len(err)
    assert "Traceback" not in err and "pw@" not in err
