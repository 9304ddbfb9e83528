"""verl custom reward function for the math families (short CoT, long CoT, tool use).

Recipe wiring (verl 0.9.1)::

    reward:
      custom_reward_function:
        path: <site-packages or repo>/envs/reward.py
        name: compute_score
        reward_kwargs: {family: longcot, max_response_length: 8192, overlong_buffer_len: 1024}

verl's reward managers call ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` from a thread pool, merging ``reward_kwargs`` into the keyword arguments. Called with
just the four arguments, the defaults of :class:`RewardOptions` apply.

Its options are :class:`RewardOptions`; the ``extra_info`` keys it reads, how it finds the answer, truncation, the
score and the returned keys are in :func:`compute_score`'s docstring; what the math scorer accepts as equal is
``docs/scoring.md``.
"""

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envs.contract import SHORT_COT
from envs.families import env_family
from envs.markup import remove_calls
from envs.scoring.extract import every_box, extract_final_answer, last_boxes, split_think
from envs.scoring.normalize import normalize_answer
from envs.scoring.offers import split_top_level
from envs.scoring.reflection import REFLECTION_PATTERNS, count_reflections
from envs.scoring.verify import Verdict, answers_equal

__all__ = ["RewardOptions", "compute_score", "overlong_penalty", "resolve_options"]

_VERL_PASSTHROUGH = {"reward_router_address", "reward_model_tokenizer"}
_TRUNC_REASONS = {"length", "max_tokens", "max_length", "truncated"}
_STOP_REASONS = {"stop", "eos", "completed", "end_turn", "tool_calls", "stop_sequence"}


class RewardOptions(BaseModel):
    """Options of ``compute_score``; later sources override earlier ones: defaults <- family preset <-
    ``extra_info["family"]`` <- ``extra_info["reward_options"]`` <- ``reward_kwargs``.

        family                   a registered family (``envs.families``: "shortcot" | "longcot" | "tooluse", or an
                                 older spelling such as "short_cot", read as its family's name; default "shortcot")
        strict_box               True: only a complete \\boxed{}/\\fbox{} counts as an answer (default True);
                                 False: also "Answer: X", "The final answer is X", "#### X"
        last_number              True: when no answer of the kinds above is found, the last number of the answer
                                 part is the answer (default False; the lenient rule for a pretrained model that
                                 answers in prose, e.g. the CPU jobs' --model runs of short CoT)
        think                    "auto" | "required" | "off" (default: the family's preset, ``EnvFamily.think``:
                                 "required" for longcot, else "auto");
                                 see ``envs.scoring.extract.split_think``
        max_response_length      response token limit of the rollout (None: unknown)
        overlong_buffer_len      DAPO soft overlong buffer in tokens (None or 0: no penalty)
        overlong_penalty_factor  DAPO penalty factor (default 1.0)
        correct_score / incorrect_score   base reward (defaults 1.0 / 0.0)
        timeout_s                CPU-time budget of one call's math-verify check, seconds (default 5), so the
                                 verdict does not depend on the machine's load; a check is killed after 3x that
                                 plus 1 s of wall-clock time; waiting for a free checker process is bounded
                                 separately (max(30, 10x))
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str = SHORT_COT  # a registered family's name (an alias is read as the name)
    strict_box: bool = True
    last_number: bool = False
    think: Literal["auto", "required", "off"] | None = None
    max_response_length: int | None = Field(default=None, gt=0)
    overlong_buffer_len: int | None = Field(default=None, ge=0)
    overlong_penalty_factor: float = Field(default=1.0, ge=0)
    correct_score: float = 1.0
    incorrect_score: float = 0.0
    timeout_s: float = Field(default=5.0, gt=0, le=600)

    @field_validator("family", mode="before")
    @classmethod
    def _family(cls, v: Any) -> str:
        return env_family(v).name  # ValueError (a validation error) for an unknown one

    @model_validator(mode="after")
    def _check(self) -> "RewardOptions":
        if self.overlong_buffer_len:
            if self.max_response_length is None:
                raise ValueError("overlong_buffer_len needs max_response_length")
            if self.overlong_buffer_len > self.max_response_length:
                raise ValueError(
                    f"overlong_buffer_len ({self.overlong_buffer_len}) exceeds max_response_length "
                    f"({self.max_response_length})"
                )
        return self

    @property
    def think_mode(self) -> str:
        """The effective think mode: explicit ``think`` or the family preset."""
        if self.think is not None:
            return self.think
        return env_family(self.family).think


_OPTIONS_CACHE: dict[tuple, "RewardOptions"] = {}


def resolve_options(extra_info: Mapping | None = None, **reward_kwargs: Any) -> RewardOptions:
    """Merge option sources (defaults <- extra_info family/reward_options <- reward_kwargs) and validate.

    Raises:
        ValueError: unknown option names or invalid values.
    """
    merged: dict[str, Any] = {}
    if isinstance(extra_info, Mapping):
        fam = extra_info.get("family")
        if isinstance(fam, str) and fam:
            merged["family"] = fam
        ro = extra_info.get("reward_options")
        if isinstance(ro, Mapping):
            merged.update({k: v for k, v in ro.items() if v is not None})
    merged.update({k: v for k, v in reward_kwargs.items() if k not in _VERL_PASSTHROUGH})
    try:
        key = tuple(sorted(merged.items()))
        hit = _OPTIONS_CACHE.get(key)
    except TypeError:  # unhashable values: validate without caching
        key, hit = None, None
    if hit is not None:
        return hit
    try:
        opts = RewardOptions(**merged)
    except ValidationError as err:
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in err.errors())  # fmt: skip
        raise ValueError(f"invalid reward options for envs.reward.compute_score: {said}") from err
    if key is not None and len(_OPTIONS_CACHE) < 1024:
        _OPTIONS_CACHE[key] = opts
    return opts


def overlong_penalty(
    length: int | None, max_response_length: int | None, buffer_len: int | None, factor: float = 1.0
) -> float:
    """DAPO soft overlong penalty (Yu et al. 2025, Eq. 13) for a response of ``length`` tokens.

    0 while ``length <= max_response_length - buffer_len``, then falling linearly to ``-factor`` at
    ``max_response_length`` (clipped there). 0 when any argument is unknown or the buffer is 0.

    Example: max 1000, buffer 200, factor 1.0 -> lengths 700, 900, 1000 give 0, -0.5, -1.0.
    """
    if length is None or length < 0 or not max_response_length or not buffer_len:
        return 0.0
    exceed = length - (max_response_length - buffer_len)
    pen = -exceed / buffer_len * factor
    return float(max(-factor, min(0.0, pen)))


_WARNED: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logging.getLogger(__name__).warning(msg)


def _as_int(x: Any) -> int | None:
    try:
        if x is None or isinstance(x, bool):
            return None
        v = int(x)
        return v if v >= 0 else None
    except (TypeError, ValueError):
        return None


def _response_length(extra_info: Mapping) -> int | None:
    n = _as_int(extra_info.get("response_length"))
    if n is not None:
        return n
    mask = extra_info.get("response_mask")
    if mask is not None and not isinstance(mask, (str, bytes)):
        try:
            if hasattr(mask, "sum"):  # numpy array / torch tensor
                return int(mask.sum())
            return int(sum(int(v) for v in mask))
        except (TypeError, ValueError):
            return None
    return None


def _is_truncated(extra_info: Mapping, length: int | None, opts: RewardOptions) -> bool:
    eos = extra_info.get("hit_eos")
    if eos is not None and not isinstance(eos, str):
        try:
            return not bool(eos)
        except (TypeError, ValueError):
            pass
    for key in ("stop_reason", "finish_reason"):
        reason = extra_info.get(key)
        if isinstance(reason, str):
            r = reason.strip().lower()
            if r in _TRUNC_REASONS:
                return True
            if r in _STOP_REASONS:
                return False
    if opts.max_response_length and length is not None:
        return length >= opts.max_response_length
    return False


def _ground_truths(gt: Any) -> list[str]:
    """Ground truth(s) as strings: a list/array of acceptable answers or a single one."""
    if gt is None:
        return []
    if isinstance(gt, Mapping):
        gt = gt.get("ground_truth", gt.get("answer"))
        return _ground_truths(gt)
    if isinstance(gt, (str, bytes)):
        s = gt.decode(errors="replace") if isinstance(gt, bytes) else gt
        return [s] if s.strip() else []
    if isinstance(gt, Sequence) or hasattr(gt, "tolist"):
        items = gt.tolist() if hasattr(gt, "tolist") else list(gt)
        if isinstance(items, list):
            return [s for x in items for s in _ground_truths(x)]
        return _ground_truths(items)
    if isinstance(gt, float) and gt.is_integer():
        return [_int_text(int(gt))]
    if isinstance(gt, int) and not isinstance(gt, bool):
        return [_int_text(gt)]
    return [str(gt)]


def _int_text(n: int) -> str:
    """The decimal digits of ``n``, also beyond Python's int-to-str digit limit (4,300 by default), which would
    raise ValueError for a huge integer ground truth."""
    try:
        return str(n)
    except ValueError:
        import decimal

        return format(decimal.Decimal(n), "f")


def _gt_answer(gt: str) -> str:
    """A ground truth given as a full solution keeps only its final answer (box or GSM8K ``####``); one that holds
    boxes joined by connectors is the list of them (``\\boxed{1} papers and \\boxed{2} bins`` -> ``1, 2``: a label
    boxes each part; see ``envs.scoring.extract.last_boxes``)."""
    if "\\boxed" in gt or "\\fbox" in gt or "####" in gt:
        ans = last_boxes(gt)
        if ans:
            return ans
        ans, _ = extract_final_answer(gt, strict_box=False)
        if ans:
            return ans
    return gt


_PART_SEP_RE = re.compile(r"[,;]")


def _parts(answer: str) -> int:
    """Number of parts of a list answer (items parted by a comma or semicolon outside brackets, after
    ``normalize_answer``, so thousands separators part nothing): 1 for a single value."""
    return len(split_top_level(normalize_answer(answer), _PART_SEP_RE))


def _tuple_parts(answer: str) -> int:
    """Number of items of a ground truth that is one tuple in parentheses (``(2, 3)`` -> 2), else 0."""
    s = normalize_answer(answer)
    if len(s) < 2 or s[0] != "(" or s[-1] != ")" or len(split_top_level(s, _PART_SEP_RE)) != 1:
        return 0
    inner = s[1:-1]
    if len(split_top_level(inner, re.compile(r"[()]"))) != 1:  # (1)(2): two groups, not one tuple
        return 0
    n = len(split_top_level(inner, _PART_SEP_RE))
    return n if n > 1 else 0


def _every_box_verdict(answer_text: str, gold: str, pred_raw: str, timeout_s: float) -> Verdict | None:
    """The verdict on the response's boxes read in order as the ground truth's k parts (a list ``2, 3`` or a tuple
    ``(2, 3)``), when it holds exactly k boxes and nothing between them withdraws one
    (``envs.scoring.extract.every_box``); None when that reading does not apply or is not equal."""
    parts, as_tuple = _parts(gold), False
    if parts < 2:
        parts, as_tuple = _tuple_parts(gold), True
    boxed = every_box(answer_text, parts) if parts > 1 else None
    if boxed is None:
        return None
    candidate = f"({boxed})" if as_tuple else boxed
    if candidate == pred_raw:
        return None
    v = answers_equal(candidate, gold, timeout_s=timeout_s)
    return v if v.equal else None


def compute_score(
    data_source: str | None = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Mapping | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """Score one response against its ground truth (verl custom reward function).

    Per-response keys read from ``extra_info`` (all optional; verl's naive/dapo managers merge an agent
    loop's ``extra_fields`` into ``extra_info``, so an agent loop can provide them):

        response_length   int: number of model-generated response tokens (tool/observation tokens excluded)
        response_mask     sequence of 0/1 (1 = model token); its sum is used when response_length is absent
        hit_eos           bool: the response ended with EOS (False = cut by the length limit)
        stop_reason / finish_reason   str: "length" / "max_tokens" mean truncated; "stop", "eos",
                          "completed", "end_turn", "tool_calls" mean not truncated

    verl's ``naive`` manager passes none of these; ``envs.reward_manager.MathRewardManager`` (the naive
    manager plus ``response_length``/``hit_eos``/``max_response_length`` from the batch) does. Do not also
    enable verl's ``dapo`` manager overlong buffer: it would penalise twice, and counts tool tokens.

    Answer: the final box run of ``envs.scoring.extract`` (a ``The final answer is $X$`` after the last box
    wins). When the ground truth is a list of k parts (commas or semicolons outside brackets; a ground truth
    holding several boxes joined by connectors is the list of them) and the answer has fewer, the last k boxes of
    the response are tried as the answer too when short connecting text joins them (parts boxed apart:
    ``y_1 = \\boxed{..}`` and ``y_2 = \\boxed{..}``; see ``envs.scoring.extract.last_boxes``), and so are all its
    boxes in order when it holds exactly k and no text between them withdraws one (``Area is \\boxed{2}, perimeter
    is \\boxed{3}.``; ``envs.scoring.extract.every_box``; a tuple ground truth ``(2, 3)`` counts its items).

    Truncation: ``hit_eos`` decides when given, else the stop reason, else a known length that reached
    ``max_response_length``. A truncated response is scored as having no answer (acc False, base
    ``incorrect_score``) whatever it holds.

    Score: ``score = (correct_score if acc else incorrect_score) + overlong_penalty`` where
    ``overlong_penalty = clip(-(L - (max_response_length - overlong_buffer_len)) / overlong_buffer_len *
    overlong_penalty_factor, -overlong_penalty_factor, 0)`` with L the model-generated token count (DAPO,
    Yu et al. 2025, "Overlong Reward Shaping"); 0 when L or the buffer is unknown.

    Returned dict (the same keys every call, scalars only, so verl can stack them):
        score (float), acc (bool), pred (str, normalised extracted answer; "" if none or truncated),
        has_answer (bool), truncated (bool), overlong_penalty (float), response_length (int, -1 unknown),
        response_chars (int), think_closed (bool), verify_method (str: exact | numeric | math_verify |
        hedge | label | malformed | choice | ellipsis | empty | timeout | error | no_ground_truth; see
        ``envs.scoring.verify``), timed_out (bool: the equivalence checker gave no verdict, because its time
        ran out or it failed; the response then scores as wrong, and nothing of that check is remembered, so a
        later call with the same pair checks it afresh; a training step logs the share of such responses as
        ``reward/timed_out/mean``, the evaluation records them as ``verdict: "unverified"``),
        reflect_<word> (int) for each of ``REFLECTION_PATTERNS`` and reflect_total (int).

    Errors: never raises for any response or ground truth (bad ones score ``incorrect_score``); raises
    ValueError only for invalid options (a configuration error, reported on the first call).

    Args:
        data_source: dataset name (not used for scoring; every math source is scored the same way).
        solution_str: the decoded response (model-generated text).
        ground_truth: the answer (str, number, or a list of acceptable answers).
        extra_info: per-row info; the keys read are listed above.
        **reward_kwargs: options (:class:`RewardOptions`); verl's ``reward_router_address`` and
            ``reward_model_tokenizer`` are accepted and ignored.
    Returns:
        dict with the keys listed above.
    Raises:
        ValueError: only for invalid options.
    """
    info = extra_info if isinstance(extra_info, Mapping) else {}
    opts = resolve_options(info, **reward_kwargs)
    text = solution_str if isinstance(solution_str, str) else ("" if solution_str is None else str(solution_str))

    length = _response_length(info)
    if length is None and opts.overlong_buffer_len:
        _warn_once(
            "no_length",
            "envs.reward.compute_score: overlong_buffer_len is set but extra_info has no response_length / "
            "response_mask, so no overlong penalty is applied. Use envs.reward_manager.MathRewardManager "
            "(reward.reward_manager: {source: importlib, name: MathRewardManager, module: {path: "
            "pkg://envs.reward_manager}}) or an agent loop that reports response_length.",
        )
    truncated = _is_truncated(info, length, opts)
    penalty = overlong_penalty(length, opts.max_response_length, opts.overlong_buffer_len, opts.overlong_penalty_factor)

    split = split_think(text, opts.think_mode)  # type: ignore[arg-type]
    answer_text = remove_calls(split.answer)  # a call's \\boxed{} is no answer
    pred_raw, how = extract_final_answer(answer_text, strict_box=opts.strict_box, last_number=opts.last_number)
    has_answer = pred_raw is not None and not truncated
    gts = _ground_truths(ground_truth)

    verdict = Verdict(False, "empty")
    if not gts:
        verdict = Verdict(None, "no_ground_truth")
    elif has_answer:
        failed = None  # a checker failure is reported unless another ground truth matched
        for gt in gts:
            gold = _gt_answer(gt)
            verdict = answers_equal(pred_raw, gold, timeout_s=opts.timeout_s)
            if verdict.equal is False and how == "box":  # the parts of a list boxed apart, prose between the boxes
                parts = _parts(gold)
                joined = last_boxes(answer_text, parts) if parts > 1 and parts > _parts(pred_raw) else None
                if joined is not None and joined != pred_raw and _parts(joined) == parts:
                    verdict = answers_equal(joined, gold, timeout_s=opts.timeout_s)
                if not verdict.equal:  # exactly k boxes in prose, none withdrawn: the parts in order
                    verdict = _every_box_verdict(answer_text, gold, pred_raw, opts.timeout_s) or verdict
            if verdict.equal:
                break
            if verdict.failed and failed is None:
                failed = verdict
        else:
            if failed is not None:
                verdict = failed

    acc = bool(verdict.equal) and has_answer
    base = opts.correct_score if acc else opts.incorrect_score
    refl = count_reflections(text)
    out: dict[str, Any] = {
        "score": float(base + penalty),
        "acc": acc,
        "pred": normalize_answer(pred_raw) if has_answer else "",
        "has_answer": bool(has_answer),
        "truncated": bool(truncated),
        "overlong_penalty": float(penalty),
        "response_length": int(length) if length is not None else -1,
        "response_chars": len(text),
        "think_closed": bool(split.closed),
        "verify_method": verdict.method,
        "timed_out": verdict.failed,
    }
    for k in REFLECTION_PATTERNS:
        out[f"reflect_{k}"] = refl[k]
    out["reflect_total"] = refl["total"]
    return out
