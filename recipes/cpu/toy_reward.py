"""Toy reward for the CPU smoke recipes: the share of the letter ``a`` in the response.

A random tiny model emits varied text, so rewards differ within a group (non-zero GRPO/STARE
advantages) without any training. Signature of verl's ``custom_reward_function``.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Fraction (0..1) of characters of ``solution_str`` equal to ``ground_truth`` (default "a")."""
    target = (ground_truth or "a")[:1] or "a"
    text = solution_str or ""
    if not text:
        return 0.0
    return text.count(target) / len(text)
