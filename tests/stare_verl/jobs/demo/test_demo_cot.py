"""Chain-of-thought families of the CPU default: problems, sampled orders, scored demonstrations, SFT tokens,
held-out evaluation, RL rows and recipes."""

import random
from collections import Counter
from itertools import permutations

import pandas as pd
import pytest
from omegaconf import OmegaConf

from envs.reward import compute_score
from envs.tiny_hf import TinyModelConfig, build_tokenizer
from stare_verl.jobs.demo import sft as S
from stare_verl.jobs.demo.sft_trainer import collate_demos
from stare_verl.jobs.families import job_family
from tests.support import cot as C
from tests.support import demos as D

pytestmark = pytest.mark.integration

FAMILIES = ("shortcot", "longcot")


@pytest.fixture(scope="module")
def splits():
    return D.split_problems(n_train=48, n_heldout=24, seed=5, n_rl=24, family="shortcot")


@pytest.fixture(scope="module")
def tok(splits, tmp_path_factory):
    texts = []
    for fam in FAMILIES:
        demos, _ = C.build_cot_demos(splits["sft_train"], fam, per_problem=2)
        texts += [S.render_demo(d) for d in demos]
    return build_tokenizer(texts, tmp_path_factory.mktemp("tok"))


def test_problems_are_real_addition_only_chain_sums_and_splits_disjoint(splits):
    for ps in splits.values():
        assert len({p.question for p in ps}) == len(ps)
        for p in ps:
            assert p.task == "chain_sum" and p.data_source == "rg/chain_sum"
            terms = C.terms_of(p)
            assert 3 <= len(terms) <= 4 and all(0 <= t <= 9 for t in terms)
            assert str(sum(terms)) == p.answer  # reasoning-gym's own answer
            assert p.expression in p.question and "-" not in p.expression
    qs = [{p.question for p in ps} for ps in splits.values()]
    assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
    # the same family and seed give the same held-out set; the CoT set is not the tool-use one
    again = D.heldout_problems(24, 5, family="shortcot")
    assert [p.question for p in again] == [p.question for p in splits["heldout"]]
    assert D.heldout_problems(24, 5, family="longcot") == again
    assert {p.task for p in D.heldout_problems(6, 5)} != {"chain_sum"}
    with pytest.raises(ValueError, match="unknown family"):
        D.sample_problems(3, 0, family="cot")


def test_terms_of_rejects_anything_but_a_sum():
    p = D.Problem("chain_sum", "q", "3", "4 - 1", 0)
    with pytest.raises(ValueError, match="not a sum"):
        C.terms_of(p)
    assert C.build_cot_demos([p], "shortcot") == ([], [p])


def test_order_sampling_is_uniform_and_avoid_excludes_one_order():
    rng = random.Random(0)
    counts = Counter(C.sample_order(3, rng) for _ in range(6000))
    assert set(counts) == set(permutations(range(3)))
    assert all(900 <= c <= 1100 for c in counts.values())  # 1000 expected each; 6 sigma ~ 175
    counts = Counter(C.sample_order(3, rng, avoid=(2, 0, 1)) for _ in range(5000))
    assert (2, 0, 1) not in counts and len(counts) == 5
    assert all(850 <= c <= 1150 for c in counts.values())


def test_short_and_long_texts():
    assert C.cot_text([4, 7, 3], (0, 1, 2), long=False) == "4 + 7 = 11, 11 + 3 = 14. \\boxed{14}"
    assert C.cot_text([4, 7, 3], (2, 0, 1), long=False) == "3 + 4 = 7, 7 + 7 = 14. \\boxed{14}"
    text = C.cot_text([4, 7, 3], (1, 2, 0), long=True, check_order=(0, 2, 1))
    assert text == (
        "<think>\nTerms: 4, 7, 3.\n7 + 3 = 10\n10 + 4 = 14\nCheck in another order:\n4 + 3 = 7\n7 + 7 = 14\n"
        "Both give 14.\n</think>\nThe sum is \\boxed{14}."
    )
    with pytest.raises(ValueError, match="not an order"):
        C.cot_text([4, 7, 3], (0, 1), long=False)
    with pytest.raises(ValueError, match="not an order"):
        C.cot_text([4, 7, 3], (0, 1, 2), long=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_demos_score_one_under_their_family_and_vary_the_order(splits, family):
    problems = splits["sft_train"]
    demos, rejected = C.build_cot_demos(problems, family, seed=1, per_problem=4)
    assert rejected == [] and len(demos) == 4 * len(problems)
    fam = job_family(family).name
    for d in demos:
        res = compute_score(
            data_source=d.problem.data_source,
            solution_str=d.text,
            ground_truth=d.problem.answer,
            extra_info={"family": fam, "hit_eos": True},
        )
        assert res["acc"] and res["score"] == 1.0 and res["pred"] == d.problem.answer
        terms = C.terms_of(d.problem)
        first = f"{terms[d.order[0]]} + {terms[d.order[1]]} = {terms[d.order[0]] + terms[d.order[1]]}"
        assert first in d.text
        if family == "longcot":
            assert d.text.startswith("<think>\n") and d.text.index("</think>") < d.text.index("\\boxed")
            assert res["think_closed"]
            # without the closed think block the long-CoT scorer gives nothing
            cut = d.text.replace("</think>", "")
            assert not compute_score(
                data_source="x", solution_str=cut, ground_truth=d.problem.answer, extra_info={"family": fam}
            )["acc"]
        else:
            assert "<think>" not in d.text
    # orders are sampled per demonstration: the first step differs across demos of one problem
    per_problem = {}
    for d in demos:
        per_problem.setdefault(d.problem.question, set()).add(d.order)
    assert sum(len(o) > 1 for o in per_problem.values()) >= len(problems) // 2
    firsts = Counter(d.order[0] for d in demos)
    assert min(firsts[i] for i in range(3)) > len(demos) / 6  # each position leads about a third (or quarter)
    assert C.build_cot_demos(problems[:5], family, seed=1, per_problem=2) == C.build_cot_demos(
        problems[:5], family, seed=1, per_problem=2
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_tokens_are_the_single_turn_agent_prompt_then_the_answer(splits, tok, family):
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tok, hf_model_type="qwen2")
    demos, _ = C.build_cot_demos(splits["sft_train"][:6], family, per_problem=1)
    for d in demos:
        ids, mask = S.encode_demo(d, tok, builder)
        assert len(ids) == len(mask)
        full = tok.apply_chat_template(d.messages(), tokenize=False)
        assert tok.decode(ids) == full[: -len("\n")]
        # verl's single_turn_agent builds the prompt exactly so (tools=None)
        prompt = list(builder.build_initial_tokens(d.prompt(), tools=None))
        n = len(prompt)
        assert ids[:n] == prompt and mask[:n] == [0] * n
        assert mask[n:] == [1] * (len(ids) - n)
        assert tok.decode(ids[n:]) == d.text + "<|im_end|>"
        batch = collate_demos(tok.pad_token_id)([{"input_ids": ids, "loss_mask": mask}])
        assert batch["labels"][0].tolist() == [-100] * n + ids[n:]


def test_sft_config_family_defaults_and_cache_key():
    tool = S.SFTConfig()
    assert "family" not in S.key_config(tool)["config"]  # tool-use keys predate the field
    short, long = S.SFTConfig(family="shortcot"), S.SFTConfig(family="longcot")
    assert len({S.config_hash(tool), S.config_hash(short), S.config_hash(long)}) == 3
    assert (short.steps, short.max_response_tokens) == (job_family("shortcot").sft_defaults["steps"], 48)
    assert S.SFTConfig(family="shortcot", steps=7).steps == 7
    assert (tool.steps, tool.decay_steps, tool.max_response_tokens, tool.stop_accuracy) == (1300, 0, 128, None)
    assert (short.steps, short.anneal_below_loss, short.digits_per_token) == (1000, None, 1)
    # tool use trains a 2-layer model (it leaves the copy plateau earlier); the CoT families the calibrated 4-layer one
    assert tool.model == TinyModelConfig(num_hidden_layers=2)
    assert S.SFTConfig(model=TinyModelConfig()).model == TinyModelConfig()  # an instance is taken whole
    # a partial architecture (a dict) goes on top of the family's: still 2 layers
    assert S.SFTConfig(model={"hidden_size": 64}).model == TinyModelConfig(num_hidden_layers=2, hidden_size=64)
    assert S.SFTConfig(family="shortcot", model={"hidden_size": 64}).model == TinyModelConfig(hidden_size=64)
    assert short.model == long.model == TinyModelConfig()
    assert S.sft_problem_count(tool) == 4096 and S.sft_problem_count(short) == 4096 // C.COT_DEMOS_PER_PROBLEM
    assert S.key_config(short)["config"]["demos_per_problem"] == C.COT_DEMOS_PER_PROBLEM


@pytest.mark.parametrize("family", FAMILIES)
def test_evaluation_scores_the_single_turn_with_the_family(splits, tok, family):
    import asyncio

    from stare_verl.jobs.demo.evaluate import run_episodes

    problems = splits["heldout"][:4]
    demos, _ = C.build_cot_demos(problems, family, per_problem=1)
    answers = {}
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tok, hf_model_type="qwen2")
    for i, d in enumerate(demos):
        text = d.text if i != 1 else d.text.replace(d.problem.answer + "}", "99}")  # one wrong answer
        answers[tuple(builder.build_initial_tokens(d.prompt(), tools=None))] = tok.encode(
            text, add_special_tokens=False
        ) + [tok.eos_token_id]
    calls = []

    async def generate(prompt_ids, temperature, max_tokens, seed):
        calls.append(max_tokens)
        return answers[tuple(prompt_ids)][:max_tokens]

    res = asyncio.run(run_episodes(problems, generate, tok, family=family, max_response_tokens=128))
    assert [r.correct for r in res] == [True, False, True, True]
    assert all(r.turns == 1 and r.tool_calls == 0 and r.termination == "answer" for r in res) and len(calls) == 4
    assert res[0].response == demos[0].text  # the whole turn is scored (EOS dropped), as verl's single-turn reward
    # a response cut by the budget scores nothing, even with the right answer inside
    short = asyncio.run(run_episodes(problems[:1], generate, tok, family=family, max_response_tokens=8))
    assert short[0].truncated and not short[0].correct and short[0].tokens == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_rl_rows_use_verls_single_turn_agent_and_our_family(tmp_path, family):
    paths = D.write_rl_parquet(
        tmp_path, n_train=12, n_val=6, seed=5, n_sft_train=48, n_heldout=24, family=family
    )
    train, val = pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])
    assert len(train) == 12 and len(val) == 6
    for df in (train, val):
        assert set(df["agent_name"]) == {"single_turn_agent"}
        assert {e["family"] for e in df["extra_info"]} == {job_family(family).name}
        assert all("tools_kwargs" not in e for e in df["extra_info"])
        assert all(len(p) == 1 and p[0]["role"] == "user" for p in df["prompt"])
    sp = D.split_problems(48, 24, 5, n_rl=12, family=family)
    assert list(train["extra_info"].map(lambda e: e["question"])) == [p.question for p in sp["rl_train"]]
    assert list(val["extra_info"].map(lambda e: e["question"])) == [p.question for p in sp["heldout"][:6]]


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_recipes_compose_validate_and_differ_only_in_reweighting(family, monkeypatch, tmp_path):
    from stare_verl.jobs.recipes import compose_recipe, recipes_dir, validate_recipe

    monkeypatch.chdir(tmp_path)  # the recipes name their files by absolute paths: any working directory
    fill = [
        "actor_rollout_ref.model.path=x",
        "data.train_files=x",
        "data.val_files=x",
        "trainer.default_local_dir=x",
    ]
    cpu = recipes_dir() / "cpu"
    cfg = compose_recipe(f"{family}_tiny_stare", fill, cpu)
    stare = validate_recipe(cfg)
    assert stare.reweight_w > 1.0 and cfg.trainer.v1.trainer_mode == "token_stats_sync"
    assert cfg.actor_rollout_ref.rollout.name == "hf" and not cfg.actor_rollout_ref.rollout.multi_turn.enable
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "single_turn_agent"
    assert cfg.reward.custom_reward_function.path == "pkg://envs.reward"
    kw = cfg.reward.custom_reward_function.reward_kwargs
    assert kw.family == job_family(family).name and kw.max_response_length == cfg.data.max_response_length
    assert cfg.reward.reward_manager.name == "MathRewardManager"
    assert cfg.data.max_response_length == job_family(family).sft_defaults["max_response_tokens"]
    grpo = validate_recipe(compose_recipe(f"{family}_tiny_grpo", fill, cpu))
    assert (grpo.reweight_w, grpo.reweight_m) == (1.0, 1.0)
    twin = compose_recipe(f"{family}_tiny_stare", fill, cpu, resolve=False)
    raw = compose_recipe(f"{family}_tiny_grpo", fill, cpu, resolve=False)
    for key in ("algorithm.stare.reweight_w", "algorithm.stare.reweight_m", "trainer.experiment_name"):
        OmegaConf.update(raw, key, OmegaConf.select(twin, key))
    assert raw == twin
