"""Reflection-token counts: words the STARE paper tracks as signs of exploration in long CoT.

``count_reflections(text)`` counts, case-insensitively and on word boundaries, each pattern of
``REFLECTION_PATTERNS`` (e.g. "Wait", "verify"/"verified"/"verification", "check"/"re-check"/
"double-check", "however", "alternatively"/"alternative", "hmm", "but", "mistake", "reconsider").
"""

from __future__ import annotations

import re

__all__ = ["REFLECTION_PATTERNS", "count_reflections"]

REFLECTION_PATTERNS: dict[str, str] = {
    "wait": r"wait",
    "verify": r"verif(?:y|ies|ied|ying|ication)",
    "check": r"(?:re-?|double-?)?check(?:s|ed|ing)?",
    "however": r"however",
    "alternatively": r"alternative(?:ly)?",
    "hmm": r"hmm+",
    "but": r"but",
    "mistake": r"mistakes?",
    "reconsider": r"re-?(?:consider|think|examine|evaluate)(?:s|ed|ing)?",
}

_COMBINED = re.compile(
    r"\b(?:" + "|".join(f"(?P<{k}>{p})" for k, p in REFLECTION_PATTERNS.items()) + r")\b", re.IGNORECASE
)


def count_reflections(text: str) -> dict[str, int]:
    """Per-pattern counts of reflection words in ``text`` plus their sum under ``"total"``.

    Args:
        text: any string (typically the whole model-generated response).
    Returns:
        dict with one int per key of ``REFLECTION_PATTERNS`` and ``"total"``. Linear time.
    """
    counts = dict.fromkeys(REFLECTION_PATTERNS, 0)
    if text:
        for m in _COMBINED.finditer(text):
            counts[m.lastgroup] += 1
    counts["total"] = sum(counts.values())
    return counts
