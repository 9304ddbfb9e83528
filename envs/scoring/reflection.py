"""Reflection-token counts: words the STARE paper tracks as signs of exploration in long CoT.

``count_reflections(text)`` counts, case-insensitively and on word boundaries, each pattern of
``REFLECTION_PATTERNS`` (e.g. "Wait", "verify"/"verified"/"verification", "check"/"re-check"/
"double-check", "however", "alternatively"/"alternative", "hmm", "but", "mistake", "reconsider").
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["REFLECTION_PATTERNS", "clear_reflection_cache", "count_reflections"]

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

_WORD_RE = re.compile(r"[a-z]+(?:-[a-z]+)*")
_FORMS: dict[str, re.Pattern] = {k: re.compile(p) for k, p in REFLECTION_PATTERNS.items()}
_FORM_CACHE: dict[str, str | None] = {}


def _category(word: str) -> str | None:
    """The pattern a (lower-case) word fully matches, or None (memoised: the vocabulary is small)."""
    hit = _FORM_CACHE.get(word, 0)
    if hit != 0:
        return hit
    cat = next((k for k, rx in _FORMS.items() if rx.fullmatch(word)), None)
    if len(_FORM_CACHE) < 200_000:
        _FORM_CACHE[word] = cat
    return cat


def clear_reflection_cache() -> None:
    """Forget the memoised word categories of :func:`count_reflections` (benchmarks, tests)."""
    _FORM_CACHE.clear()


def count_reflections(text: str) -> dict[str, int]:
    """Per-pattern counts of reflection words in ``text`` plus their sum under ``"total"``.

    Args:
        text: any string (typically the whole model-generated response).
    Returns:
        dict with one int per key of ``REFLECTION_PATTERNS`` and ``"total"``. Linear time: the text's
        words are counted once (``collections.Counter``) and each distinct word is classified once.
    """
    counts = dict.fromkeys(REFLECTION_PATTERNS, 0)
    if text:
        for word, n in Counter(_WORD_RE.findall(text.lower())).items():
            cat = _category(word)
            if cat is not None:
                counts[cat] += n
    counts["total"] = sum(counts.values())
    return counts
