"""Text from people and from the backend, made inert in the markdown prefect-ito writes.

Targets, data references, booking and run ids, decision notes, names, stage names and the
backend's warnings all end up in the markdown of the Prefect UI: artifact cards, their
descriptions, and the forms a person answers. None of it may become markdown: a backtick that
closes an inline code span early turns the rest into live markup (``![x](http://…)`` loads an
image from anywhere, a link can point anywhere, a ``|`` opens a new table cell, a line break
ends a table). Every builder puts such text through one of the two functions here.

- :func:`text` escapes every ASCII punctuation character with a backslash, which CommonMark
  renders as the character itself, and puts line breaks on one line (text of only spaces
  starts with a no-break space instead, so it is still a line of text).
- :func:`code` makes an inline code span whose fence is longer than any run of backticks in the
  text, so nothing in it can close the span.

Both are for one line: inside a table cell (``cell=True`` for :func:`code`), a heading or a
sentence.
"""

from __future__ import annotations

import re

__all__ = ["code", "is_http_url", "text"]

_PUNCTUATION = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")
_LINE_BREAKS = re.compile(r"[\r\n\t\v\f\u0085\u2028\u2029]+")
_BACKTICKS = re.compile(r"`+")
_SAFE_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?#@!$&'*+,;=%-]+$")
"""An http(s) URL with nothing that could end a markdown link's target early (no parentheses,
brackets, spaces, angle brackets or backslashes)."""


def _one_line(value: str) -> str:
    return _LINE_BREAKS.sub(" ", value)


def text(value: object) -> str:
    """Return ``value`` as markdown that shows exactly its characters, on one line.

    Example:
        >>> text("![x](http://e.test) | *a*")
        '\\\\!\\\\[x\\\\]\\\\(http\\\\:\\\\/\\\\/e\\\\.test\\\\) \\\\| \\\\*a\\\\*'
    """
    shown = _PUNCTUATION.sub(r"\\\1", _one_line(str(value)))
    # Markdown drops spaces at the ends of a line, so a list item of only spaces would be an
    # empty item, not a line of text. A no-break space is text there, and looks the same; a
    # character reference (&#32;) would do for CommonMark, but the Prefect UI shows it as written.
    return shown if shown.strip(" ") else f"\u00a0{shown[1:]}"


def is_http_url(value: str) -> bool:
    """Tell whether ``value`` is an http(s) URL that can stand as a link target as it is."""
    return bool(_SAFE_URL.match(value))


def code(value: object, *, cell: bool = False) -> str:
    """Return ``value`` as one inline code span that nothing in it can close.

    Args:
        value: The text, shown as it is (but on one line).
        cell: The span is inside a table cell: a ``|`` would end the cell even inside code, so
            it is escaped (GFM tables read ``\\|`` as a ``|`` within the cell).
    """
    shown = _one_line(str(value))
    if cell:
        shown = shown.replace("|", "\\|")
    longest = max((len(run) for run in _BACKTICKS.findall(shown)), default=0)
    fence = "`" * (longest + 1)
    # A span that starts or ends with a backtick needs a space inside its fence (CommonMark
    # strips one space from each end of a span that has one on both).
    if shown.startswith("`") or shown.endswith("`") or not shown.strip(" "):
        shown = f" {shown} "
    return f"{fence}{shown}{fence}"
