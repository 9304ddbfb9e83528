"""Math answer scoring: extraction, normalisation and equivalence (fast paths + math-verify).

Public API:
    extract_boxed, extract_final_answer, find_boxed_all, split_think  (envs.scoring.extract)
    normalize_answer                                                   (envs.scoring.normalize)
    evaluate, numeric_equal                                            (envs.scoring.numeric)
    answers_equal, Verdict, MathVerifyPool, get_pool, prewarm,
    clear_verdict_cache                                                (envs.scoring.verify)
    count_reflections, REFLECTION_PATTERNS                             (envs.scoring.reflection)
"""

from envs.scoring.extract import extract_boxed, extract_final_answer, find_boxed_all, split_think
from envs.scoring.normalize import normalize_answer
from envs.scoring.numeric import evaluate, numeric_equal
from envs.scoring.reflection import REFLECTION_PATTERNS, count_reflections
from envs.scoring.verify import MathVerifyPool, Verdict, answers_equal, clear_verdict_cache, get_pool, prewarm

__all__ = [
    "REFLECTION_PATTERNS",
    "MathVerifyPool",
    "Verdict",
    "answers_equal",
    "clear_verdict_cache",
    "count_reflections",
    "evaluate",
    "extract_boxed",
    "extract_final_answer",
    "find_boxed_all",
    "get_pool",
    "normalize_answer",
    "numeric_equal",
    "prewarm",
    "split_think",
]
