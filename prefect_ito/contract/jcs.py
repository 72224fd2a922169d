"""RFC 8785, the JSON Canonicalization Scheme (JCS): one byte sequence for one JSON value.

The manifest digest of a training request is the SHA-256 of its fields in this form, so that a
backend written in any language computes the same digest (the canonical Itô CLI is JavaScript).
JCS fixes the three things ``json.dumps(sort_keys=True)`` leaves to Python:

- **Numbers** are written as ECMAScript's ``Number.prototype.toString`` writes an IEEE 754
  double: ``250000`` rather than ``250000.0``, ``1e+21`` rather than ``1e21``, ``1e-7`` rather than
  ``1e-07``, and never ``NaN`` or ``Infinity``.
- **Object members** are ordered by the UTF-16 code units of their names, which differs from code
  point order outside the Basic Multilingual Plane (``"😀"`` sorts before ``"דּ"``).
- **Strings** escape only ``"``, ``\\`` and control characters (``\\b \\t \\n \\f \\r``, else
  ``\\u00xx``); everything else is written as UTF-8, as is.

The tests check this module against an independent implementation and the published vectors.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["canonicalize"]

_ESCAPED = re.compile(r'["\\\x00-\x1f]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_SHORT_ESCAPES["\r"] = "\\r"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_EXACT_INT = 2**53


def canonicalize(value: Any) -> bytes:
    """Return the RFC 8785 canonical form of a JSON value, as UTF-8.

    Args:
        value: ``None``, a bool, an int, a float, a str, a list or tuple, or a dict with str
            keys, nested to any depth.

    Returns:
        The canonical JSON text, encoded as UTF-8.

    Raises:
        ValueError: A number that is not finite or not exactly an IEEE 754 double, or a string
            with a lone surrogate (JCS has no form for either).
        TypeError: A value or key of a type JSON has no form for.

    Example:
        ```python
        canonicalize({"b": 250000.0, "a": [1, "x"]})  # b'{"a":[1,"x"],"b":250000}'
        ```
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts).encode("utf-8")


def _write(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, int):
        parts.append(_integer(value))
    elif isinstance(value, float):
        parts.append(_number(value))
    elif isinstance(value, list | tuple):
        _write_array(value, parts)
    elif isinstance(value, dict):
        _write_object(value, parts)
    else:
        raise TypeError(f"JSON has no form for a {type(value).__name__}")


def _write_array(items: list[Any] | tuple[Any, ...], parts: list[str]) -> None:
    parts.append("[")
    for index, item in enumerate(items):
        if index:
            parts.append(",")
        _write(item, parts)
    parts.append("]")


def _write_object(members: dict[Any, Any], parts: list[str]) -> None:
    names: dict[str, str] = {}
    for key in members:
        if not isinstance(key, str):
            raise TypeError(f"JSON object names are strings, not {type(key).__name__}")
        names[key] = _string(key)
    parts.append("{")
    # Big-endian UTF-16 bytes compare exactly as the code units do.
    for index, key in enumerate(sorted(names, key=lambda name: name.encode("utf-16-be"))):
        if index:
            parts.append(",")
        parts.append(names[key])
        parts.append(":")
        _write(members[key], parts)
    parts.append("}")


def _string(text: str) -> str:
    if _LONE_SURROGATE.search(text):
        raise ValueError("a string with a lone surrogate has no canonical JSON form")
    return '"' + _ESCAPED.sub(_escape, text) + '"'


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _integer(value: int) -> str:
    # JSON numbers are IEEE 754 doubles in JCS: a larger int must be one exactly.
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if abs(value) > _MAX_EXACT_INT and number != value:
        raise ValueError("an integer no IEEE 754 double holds exactly has no canonical JSON form")
    return _number(number)


def _number(value: float) -> str:
    """Return ``value`` as ECMAScript's ``Number.prototype.toString`` writes it."""
    if not math.isfinite(value):
        raise ValueError("NaN and the infinities have no canonical JSON form")
    if value == 0:
        return "0"  # and so is -0
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that read back as the same double, as ECMAScript does;
    # only where the decimal point goes, and when to use an exponent, differ.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    digits = all_digits.lstrip("0")
    # value = 0.<digits> × 10**point
    point = len(whole) + int(exponent or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    return sign + _place_point(digits, point)


def _place_point(digits: str, point: int) -> str:
    count = len(digits)
    if count <= point <= 21:
        return digits + "0" * (point - count)
    if 0 < point <= 21:
        return digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    power = point - 1
    exponent = ("+" if power >= 0 else "-") + str(abs(power))
    head = digits[0] + ("." + digits[1:] if count > 1 else "")
    return head + "e" + exponent
