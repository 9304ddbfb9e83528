"""envs.reward.compute_score: the cases users hit, long CoT, DAPO overlong penalty, truncation, robustness,
and the real verl call paths (custom reward function loader and the naive reward manager's thread pool)."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from envs.reward import RewardOptions, compute_score, overlong_penalty, resolve_options
from envs.scoring import REFLECTION_PATTERNS
from tests.support import REPO


@pytest.fixture(scope="module", autouse=True)
def _close_scorer_workers():
    yield
    from envs.scoring import get_pool

    get_pool().close()  # math-verify workers started by compute_score


REASONING = "We compute step by step. First 3 + 4 = 7, then multiply by 6 to get 42. "


# --------------------------------------------------------------------------------- cases users hit


@pytest.mark.parametrize(
    "response, gt",
    [
        (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{12 \text{ cm}}", "12"),
        (r"\boxed{50\%}", "50"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{x=5}", "5"),
        (r"\fbox{42}", "42"),
    ],
)
def test_common_formats_are_correct(response, gt):
    r = compute_score("math500", REASONING + "So the answer is " + response + ".", gt)
    assert r["score"] == 1.0 and r["acc"] is True and r["has_answer"] is True


def test_no_box_scores_zero_in_strict_mode():
    r = compute_score("gsm8k", "It could be 42 or 17.", "42")
    assert r["score"] == 0.0 and r["acc"] is False and r["pred"] == "" and r["verify_method"] == "empty"
    assert RewardOptions().strict_box is True  # strict is the default


def test_non_strict_mode_reads_answer_lines():
    assert compute_score("dapo", "work\nAnswer: 42", "42", strict_box=False)["score"] == 1.0
    assert compute_score("dapo", "work\nAnswer: 42", "42", strict_box=True)["score"] == 0.0


@pytest.mark.parametrize("length, penalty", [(700, 0.0), (900, -0.5), (1000, -1.0)])
def test_dapo_overlong_penalty(length, penalty):
    assert overlong_penalty(length, 1000, 200, 1.0) == pytest.approx(penalty)
    r = compute_score(
        "aime", r"\boxed{5}", "5", {"response_length": length, "hit_eos": True},
        max_response_length=1000, overlong_buffer_len=200, overlong_penalty_factor=1.0,
    )
    assert r["overlong_penalty"] == pytest.approx(penalty)
    assert r["score"] == pytest.approx(1.0 + penalty)
    assert r["response_length"] == length and r["truncated"] is False


def test_penalty_counts_model_tokens_only():
    # 1000 response tokens of which 300 are tool output (mask 0): 700 model tokens -> no penalty
    mask = [1] * 400 + [0] * 300 + [1] * 300
    r = compute_score(
        "tool", r"\boxed{5}", "5", {"response_mask": mask, "hit_eos": True},
        max_response_length=1000, overlong_buffer_len=200,
    )
    assert r["response_length"] == 700 and r["overlong_penalty"] == 0.0 and r["score"] == 1.0


def test_truncated_response_scores_zero_even_with_partial_box():
    text = REASONING + r"so the answer is \boxed{4"
    r = compute_score("aime", text, "42", {"response_length": 1000, "hit_eos": False})
    assert r["truncated"] is True and r["score"] == 0.0 and r["acc"] is False and r["pred"] == ""
    # a complete right box before the cut does not rescue a truncated response either
    r = compute_score("aime", REASONING + r"\boxed{42} but wait, let me re", "42", {"hit_eos": False})
    assert r["truncated"] is True and r["score"] == 0.0
    # with the overlong buffer on, the penalty applies on top
    r = compute_score(
        "aime", text, "42", {"response_length": 1000, "hit_eos": False},
        max_response_length=1000, overlong_buffer_len=200,
    )
    assert r["score"] == pytest.approx(-1.0)


def test_overlong_without_token_counts_warns_once(caplog):
    import envs.reward as reward

    reward._WARNED.discard("no_length")
    with caplog.at_level("WARNING", logger="envs.reward"):
        r = compute_score("x", r"\boxed{1}", "1", max_response_length=1000, overlong_buffer_len=200)
        compute_score("x", r"\boxed{1}", "1", max_response_length=1000, overlong_buffer_len=200)
    assert r["overlong_penalty"] == 0.0 and r["response_length"] == -1
    assert sum("MathRewardManager" in m for m in caplog.messages) == 1


def test_truncation_sources():
    assert compute_score("x", r"\boxed{1}", "1", {"stop_reason": "length"})["truncated"] is True
    assert compute_score("x", r"\boxed{1}", "1", {"finish_reason": "stop"})["truncated"] is False
    # no EOS info: a length at the limit counts as truncated, below it not
    assert compute_score("x", r"\boxed{1}", "1", {"response_length": 1000}, max_response_length=1000)["truncated"]
    assert not compute_score("x", r"\boxed{1}", "1", {"response_length": 999}, max_response_length=1000)["truncated"]
    assert compute_score("x", r"\boxed{1}", "1")["truncated"] is False


# ----------------------------------------------------------------------------------------- long CoT


def test_long_cot_scores_the_answer_after_reasoning():
    r1 = r"Let me try \boxed{7}. Wait, that is wrong; check again: 8.</think>The answer is \boxed{8}."
    r = compute_score("aime", r1, "8", {"family": "long_cot"})
    assert r["score"] == 1.0 and r["think_closed"] is True and r["pred"] == "8"
    # the box inside the reasoning is not the answer
    assert compute_score("aime", r1, "7", {"family": "long_cot"})["score"] == 0.0
    # Qwen3 style with both tags
    q3 = "<think>\nhmm, 2+2\n</think>\n\n" + r"\boxed{4}"
    assert compute_score("aime", q3, "4", {"family": "long_cot"})["score"] == 1.0
    # reasoning that never closed has no answer
    assert compute_score("aime", r"thinking \boxed{4} still", "4", {"family": "long_cot"})["score"] == 0.0
    # the same text in short_cot (think auto) is scored on the whole text
    assert compute_score("x", r"thinking \boxed{4} still", "4")["score"] == 1.0


def test_reflection_counts_and_length_are_logged():
    text = "Wait, let me verify this. Hmm. However, alternatively we could check: but wait.</think>" + r"\boxed{1}"
    r = compute_score("aime", text, "1", {"family": "long_cot", "response_length": 40})
    assert r["reflect_wait"] == 2 and r["reflect_verify"] == 1 and r["reflect_hmm"] == 1
    assert r["reflect_however"] == 1 and r["reflect_alternatively"] == 1 and r["reflect_check"] == 1
    assert r["reflect_but"] == 1 and r["reflect_total"] == 8
    assert r["response_length"] == 40 and r["response_chars"] == len(text)


# ------------------------------------------------------------------------------------ options & keys


def test_options_sources_and_precedence():
    assert resolve_options().think_mode == "auto"
    assert resolve_options({"family": "long_cot"}).think_mode == "required"
    assert resolve_options({"family": "long_cot"}, think="auto").think_mode == "auto"
    assert resolve_options({"reward_options": {"strict_box": False}}).strict_box is False
    assert resolve_options({"reward_options": {"strict_box": False}}, strict_box=True).strict_box is True
    r = compute_score("x", r"\boxed{5}", "5", correct_score=1.0, incorrect_score=-1.0)
    assert r["score"] == 1.0
    assert compute_score("x", r"\boxed{6}", "5", incorrect_score=-1.0)["score"] == -1.0



def test_reward_families_are_the_registered_ones_under_one_name():
    from envs.contract import FAMILIES

    assert FAMILIES == ("shortcot", "longcot", "tooluse")
    assert [resolve_options({"family": f}).family for f in FAMILIES] == list(FAMILIES)
    # the older spelling of existing parquet rows and recipes is read as the family's one name, preset included
    assert [resolve_options({"family": f}).family for f in ("short_cot", "long_cot", "tool_use")] == list(FAMILIES)
    assert resolve_options({"family": "long_cot"}).think_mode == "required"
    assert resolve_options(None, family="long_cot").think_mode == "required"
    assert resolve_options({"family": "short_cot"}).think_mode == "auto"
    with pytest.raises(ValueError, match="invalid reward options"):
        resolve_options({"family": "cot"})
@pytest.mark.parametrize(
    "bad",
    [{"strict_bx": True}, {"family": "chess"}, {"overlong_buffer_len": 200}, {"timeout_s": 0},
     {"max_response_length": 100, "overlong_buffer_len": 200}],
)
def test_invalid_options_raise_clear_errors(bad):
    with pytest.raises(ValueError, match="invalid reward options") as err:
        compute_score("x", r"\boxed{1}", "1", **bad)
    # one line naming the option, without pydantic's framing (its "Value error, " prefix, type tags, links)
    text = str(err.value)
    assert "\n" not in text and "Value error" not in text and "pydantic.dev" not in text
    assert next(iter(bad)) in text


def test_verl_passthrough_kwargs_accepted():
    r = compute_score("x", r"\boxed{1}", "1", None, reward_router_address=None, reward_model_tokenizer=None)
    assert r["score"] == 1.0


def test_same_scalar_keys_every_call():
    expected = {
        "score", "acc", "pred", "has_answer", "truncated", "overlong_penalty", "response_length", "response_chars",
        "think_closed", "verify_method", "timed_out", "reflect_total",
    } | {f"reflect_{k}" for k in REFLECTION_PATTERNS}
    outs = [
        compute_score("x", r"\boxed{1}", "1"),
        compute_score("x", "nothing", "1", {"hit_eos": False}),
        compute_score("x", None, None),
        compute_score("x", r"\boxed{(1,2)}", ["(1,2)", "(2,1)"]),
    ]
    for r in outs:
        assert set(r) == expected
        assert all(isinstance(v, (bool, int, float, str)) for v in r.values())


def test_ground_truth_forms():
    assert compute_score("x", r"\boxed{7}", 7)["score"] == 1.0
    assert compute_score("x", r"\boxed{7}", 7.0)["score"] == 1.0
    assert compute_score("x", r"\boxed{7}", ["6", "7"])["score"] == 1.0
    assert compute_score("x", r"\boxed{72}", "so 9*8 = 72\n#### 72")["score"] == 1.0  # GSM8K solution
    assert compute_score("x", r"\boxed{72}", r"so \boxed{72}")["score"] == 1.0
    r = compute_score("x", r"\boxed{7}", "")
    assert r["score"] == 0.0 and r["verify_method"] == "no_ground_truth"
    # integers beyond Python's int-to-str digit limit (4,300) are ground truths too, never a ValueError
    for big in (10**5000, -(7**6000), float(10**300)):
        assert compute_score("x", r"\boxed{5}", big)["acc"] is False
    huge = 10**5000
    assert compute_score("x", "\\boxed{1" + "0" * 5000 + "}", huge, timeout_s=10)["acc"] is True


def test_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = list("\\{}$^_()[]0123456789x=,.%") + [r"\boxed{", r"\fbox{", r"\frac", r"\sqrt", "</think>", "<think>"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        gt = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        r = compute_score("x", text, gt, {"response_length": rng.randint(-5, 50)}, timeout_s=5.0)
        assert r["score"] in (0.0, 1.0)
    for weird in (b"\xff", 3.5, {"a": 1}, object()):
        assert compute_score("x", weird, "1")["score"] == 0.0
        assert compute_score("x", r"\boxed{1}", weird)["score"] in (0.0, 1.0)


def test_pathological_latex_hits_the_hard_limit_in_a_thread():
    out = {}

    def run():
        t0 = time.perf_counter()
        out["r"] = compute_score("x", r"\boxed{(10^{6})!}", "1", timeout_s=1.0)
        out["t"] = time.perf_counter() - t0

    compute_score("x", r"\boxed{x^2}", "x^2+0", timeout_s=60.0)  # make sure a worker is up
    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=60)
    assert not th.is_alive()
    assert out["r"]["score"] == 0.0 and out["r"]["acc"] is False
    assert out["r"]["verify_method"] in ("timeout", "math_verify")  # whichever limit fires first
    assert out["t"] < 30.0  # a hang guard: the 1 s limit is CPU time, so wall time stretches under load


# ------------------------------------------------------------------------------------ verl call paths


@pytest.fixture(scope="module")
def verl_reward():
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    path = str(REPO / "envs" / "reward.py")
    cfg = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": path, "name": "compute_score", "reward_kwargs": {}}}}
    )
    return get_custom_reward_fn, cfg


def test_verl_custom_reward_loader_with_reward_kwargs(verl_reward):
    get_custom_reward_fn, cfg = verl_reward
    fn = get_custom_reward_fn(cfg)
    r = fn(data_source="math500", solution_str=r"\boxed{\dfrac{3}{4}}", ground_truth=r"\frac34", extra_info={})
    assert r["score"] == 1.0
    cfg.reward.custom_reward_function.reward_kwargs = {"family": "long_cot", "incorrect_score": -1.0}
    fn = get_custom_reward_fn(cfg)
    r = fn(data_source="aime", solution_str=r"\boxed{3}", ground_truth="3", extra_info={})
    assert r["score"] == -1.0  # long_cot requires the closing </think>


def test_verl_naive_reward_manager_runs_us_in_its_thread_pool(verl_reward):
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    get_custom_reward_fn, cfg = verl_reward
    cfg.reward.custom_reward_function.reward_kwargs = {}
    fn = get_custom_reward_fn(cfg)
    threads = []

    def spy(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return fn(*args, **kwargs)

    class CharTokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(int(i)) for i in ids if int(i) > 0)

    text = r"so \boxed{\dfrac{1}{2}}"
    ids = torch.tensor([[ord(c) for c in text] + [0, 0]])
    data = DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": torch.tensor([[1] * len(text) + [0, 0]])},
        non_tensors={
            "data_source": np.array(["math500"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "0.5"}], dtype=object),
            "extra_info": np.array([{"index": 0}], dtype=object),
        },
    )

    async def go():
        mgr = NaiveRewardManager(OmegaConf.create({"reward": {}}), CharTokenizer(), spy)
        return await mgr.run_single(data)

    out = asyncio.run(go())
    assert out["reward_score"] == 1.0 and out["reward_extra_info"]["pred"] == r"\frac{1}{2}"
    assert threads == [False]  # verl called us from a worker thread


def _char_batch(text, gt, extra_info, eos=None, pad=2):
    import numpy as np
    import torch
    from verl import DataProto

    ids = [ord(c) for c in text] + ([eos] if eos is not None else [])
    n = len(ids)
    return DataProto.from_dict(
        tensors={"responses": torch.tensor([ids + [0] * pad]), "attention_mask": torch.tensor([[1] * n + [0] * pad])},
        non_tensors={
            "data_source": np.array(["aime"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": gt}], dtype=object),
            "extra_info": np.array([extra_info], dtype=object),
        },
    )


class _CharTokenizer:
    eos_token_id = 3

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids if int(i) > 3)

    def get_vocab(self):
        return {"<|im_end|>": 1}


def test_math_reward_manager_supplies_length_and_eos(verl_reward):
    from omegaconf import OmegaConf

    from envs.reward_manager import MathRewardManager

    get_custom_reward_fn, cfg = verl_reward
    cfg.reward.custom_reward_function.reward_kwargs = {"overlong_buffer_len": 10}
    fn = get_custom_reward_fn(cfg)
    text = r"so \boxed{7}"  # 12 characters = 12 tokens
    shared = {"index": 0}

    async def score(data, limit):
        conf = OmegaConf.create({"reward": {}, "actor_rollout_ref": {"rollout": {"response_length": limit}}})
        mgr = MathRewardManager(conf, _CharTokenizer(), fn)
        return await mgr.run_single(data)

    # ends with EOS, 13 tokens of a 20-token limit: 3 tokens into the 10-token buffer -> -0.3
    out = asyncio.run(score(_char_batch(text, "7", shared, eos=3), 20))
    info = out["reward_extra_info"]
    assert info["response_length"] == 13 and info["truncated"] is False
    assert info["overlong_penalty"] == pytest.approx(-0.3) and out["reward_score"] == pytest.approx(0.7)
    # no EOS and at the limit: truncated, scores 0 plus the full penalty
    out = asyncio.run(score(_char_batch(text, "7", shared), 12))
    assert out["reward_extra_info"]["truncated"] is True and out["reward_score"] == pytest.approx(-1.0)
    # <|im_end|> (id 1, from the vocabulary) also counts as an end token
    out = asyncio.run(score(_char_batch(text, "7", shared, eos=1), 13))
    assert out["reward_extra_info"]["truncated"] is False
    # an agent loop's own count (model tokens only) wins over the manager's
    data = _char_batch(text, "7", shared, eos=3)
    data.non_tensor_batch["tool_extra_fields"] = __import__("numpy").array([{"response_length": 5}], dtype=object)
    out = asyncio.run(score(data, 20))
    assert out["reward_extra_info"]["response_length"] == 5 and out["reward_extra_info"]["overlong_penalty"] == 0.0
    assert shared == {"index": 0}  # the row's extra_info dict is not mutated


def test_math_reward_manager_loads_the_way_verl_loads_it(verl_reward):
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    for path in (str(REPO / "envs" / "reward_manager.py"), "pkg://envs.reward_manager"):
        cfg = OmegaConf.create(
            {"reward": {"reward_manager": {"source": "importlib", "name": "MathRewardManager", "module": {"path": path}}}}
        )
        cls = resolve_reward_manager_cls(cfg)
        assert cls.__name__ == "MathRewardManager" and issubclass(cls, RewardManagerBase)
