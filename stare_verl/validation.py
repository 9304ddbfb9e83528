"""Pydantic validation errors as the one-line messages the jobs print (a light module: no imports beyond the
standard library, so the evaluation and the options pay nothing for it)."""

from __future__ import annotations

from collections.abc import Mapping

PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic puts before the message of a validator's ``ValueError`` / ``assert``: not for a user's eyes."""


def error_text(error: Mapping) -> str:
    """The message of one entry of ``ValidationError.errors()`` without pydantic's ``Value error, `` /
    ``Assertion failed, `` prefix (and, for a failed ``assert``, without the statement pydantic appends)."""
    msg = str(error.get("msg", ""))
    if msg.startswith("Assertion failed, "):  # then the assert statement on lines of its own
        msg = msg.splitlines()[0]
    for prefix in PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    return msg
