"""The canonical manifest is RFC 8785 (JCS), checked against an independent implementation.

``rfc8785`` (a dev dependency only) is the oracle: prefect-ito's own canonicalizer must agree with
it on the published vectors in docs/contract.md, on RFC 8785's own number table, and on arbitrary
JSON values.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_ito.contract import TrainingRequest
from prefect_ito.contract.jcs import canonicalize

CONTRACT_DOC = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
VECTOR = re.compile(
    r"^```text\ninput:     (?P<input>.+)\ncanonical: (?P<canonical>.+)\n"
    r"digest:    (?P<digest>sha256:[0-9a-f]{64})\n```$",
    re.MULTILINE,
)
# RFC 8785 Appendix B: IEEE 754 bit patterns and how ECMAScript writes them.
RFC_NUMBERS = {
    0x0000000000000000: "0",
    0x8000000000000000: "0",
    0x0000000000000001: "5e-324",
    0x8000000000000001: "-5e-324",
    0x7FEFFFFFFFFFFFFF: "1.7976931348623157e+308",
    0xFFEFFFFFFFFFFFFF: "-1.7976931348623157e+308",
    0x4340000000000000: "9007199254740992",
    0xC340000000000000: "-9007199254740992",
    0x4430000000000000: "295147905179352830000",
    0x44B52D02C7E14AF5: "9.999999999999997e+22",
    0x44B52D02C7E14AF6: "1e+23",
    0x44B52D02C7E14AF7: "1.0000000000000001e+23",
    0x444B1AE4D6E2EF4E: "999999999999999700000",
    0x444B1AE4D6E2EF4F: "999999999999999900000",
    0x444B1AE4D6E2EF50: "1e+21",
    0x3EB0C6F7A0B5ED8C: "9.999999999999997e-7",
    0x3EB0C6F7A0B5ED8D: "0.000001",
    0x41B3DE4355555553: "333333333.3333332",
    0x41B3DE4355555554: "333333333.33333325",
    0x41B3DE4355555555: "333333333.3333333",
    0x41B3DE4355555556: "333333333.3333334",
    0x41B3DE4355555557: "333333333.33333343",
    0xBECBF647612F3696: "-0.0000033333333333333333",
    0x43143FF3C1CB0959: "1424953923781206.2",
}


def _published_vectors() -> list[dict[str, str]]:
    return [match.groupdict() for match in VECTOR.finditer(CONTRACT_DOC.read_text("utf-8"))]


VECTORS = _published_vectors()


def test_the_published_vectors_cover_what_the_contract_promises() -> None:
    manifests = [json.loads(v["input"]) for v in VECTORS if "booking_id" in v["input"]]
    budgets = [m["budget_usd"] for m in manifests]
    canonical = "".join(v["canonical"] for v in VECTORS)
    assert any(float(b).is_integer() for b in budgets), "a whole-number budget"
    assert any(not float(b).is_integer() for b in budgets), "a fractional budget"
    assert any(127 < ord(c) <= 0xFFFF for c in canonical), "non-ASCII text"
    assert any(ord(c) > 0xFFFF for c in canonical), "text outside the BMP"


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["digest"][7:19])
def test_published_vector_agrees_with_an_independent_implementation(
    vector: dict[str, str],
) -> None:
    value = json.loads(vector["input"])
    expected = vector["canonical"].encode("utf-8")

    assert canonicalize(value) == expected
    assert rfc8785.dumps(value) == expected
    assert "sha256:" + hashlib.sha256(expected).hexdigest() == vector["digest"]


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if "booking_id" in v["input"]], ids=lambda v: v["digest"][7:19]
)
def test_training_request_digest_is_the_published_one(vector: dict[str, str]) -> None:
    request = TrainingRequest(**json.loads(vector["input"]))

    assert request.canonical_manifest() == vector["canonical"].encode("utf-8")
    assert request.digest() == vector["digest"]


def test_a_whole_number_budget_is_written_as_javascript_writes_it() -> None:
    request = TrainingRequest(
        booking_id="bk-1", model_size="8B", data_refs=["catalog://x"], target="t", budget_usd=250000
    )
    assert b'"budget_usd":250000,' in request.canonical_manifest()


@pytest.mark.parametrize(("bits", "expected"), RFC_NUMBERS.items(), ids=str)
def test_numbers_follow_rfc_8785(bits: int, expected: str) -> None:
    (value,) = struct.unpack(">d", bits.to_bytes(8, "big"))

    assert canonicalize(value) == expected.encode()
    assert rfc8785.dumps(value) == expected.encode()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(value=json_values)
def test_any_json_value_canonicalizes_as_the_independent_implementation_does(value: object) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, "\ud800", {"\udfff": 1}, 2**53 + 1, 10**400]
)
def test_values_without_a_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="no canonical JSON form"):
        canonicalize(value)


@pytest.mark.parametrize("value", [{1: "x"}, {"a": {1, 2}}, b"bytes"])
def test_values_json_cannot_hold_are_type_errors(value: object) -> None:
    with pytest.raises(TypeError):
        canonicalize(value)
