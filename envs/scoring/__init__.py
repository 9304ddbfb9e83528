"""Math answer scoring: extraction, normalisation and equivalence (fast paths + math-verify).

Public API:
    extract_boxed, extract_final_answer, find_boxed_all, split_think  (envs.scoring.extract)
    normalize_answer                                                   (envs.scoring.normalize)
    offers                                                             (envs.scoring.offers)
    evaluate, numeric_equal                                            (envs.scoring.numeric)
    answers_equal, Verdict, MathVerifyPool, get_pool, prewarm,
    clear_verdict_cache                                                (envs.scoring.verify)
    count_reflections, REFLECTION_PATTERNS                             (envs.scoring.reflection)
    clear_caches                                                       (every memo above, for benchmarks)
"""

from envs.scoring.extract import extract_boxed, extract_final_answer, find_boxed_all, split_think
from envs.scoring.normalize import clear_normalize_cache, normalize_answer
from envs.scoring.numeric import evaluate, numeric_equal
from envs.scoring.offers import offers
from envs.scoring.reflection import REFLECTION_PATTERNS, clear_reflection_cache, count_reflections
from envs.scoring.verify import MathVerifyPool, Verdict, answers_equal, clear_verdict_cache, get_pool, prewarm

__all__ = [
    "REFLECTION_PATTERNS",
    "MathVerifyPool",
    "Verdict",
    "answers_equal",
    "clear_caches",
    "clear_verdict_cache",
    "count_reflections",
    "evaluate",
    "extract_boxed",
    "extract_final_answer",
    "find_boxed_all",
    "get_pool",
    "normalize_answer",
    "numeric_equal",
    "offers",
    "prewarm",
    "split_think",
]


def clear_caches() -> None:
    """Forget every memo of the scorer: math-verify verdicts, normalised answers, numeric values and reflection
    word categories (a benchmark's cold start). Never raises."""
    clear_verdict_cache()
    clear_normalize_cache()
    evaluate.cache_clear()
    offers.cache_clear()
    clear_reflection_cache()
