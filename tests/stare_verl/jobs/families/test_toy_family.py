"""A new family is a descriptor, not an edit of the jobs (issue 28): a toy family registered here (an
``envs.family.EnvFamily`` with its own reward, a ``stare_verl.jobs.families.JobFamily`` with its own task table and
demonstrations) runs through the CPU demo's data (problems, splits, RL parquet), SFT-data (configuration, cache key,
demonstrations, tokens) and evaluation (the demo's episodes, the local-checkpoint evaluation of an SFT checkpoint)
paths, and the CLIs offer it, without a line of the jobs knowing its name."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from envs.families import env_family, register_env_family, row_env_family, unregister_env_family
from envs.family import EnvFamily
from stare_verl.jobs.families import (
    JobFamily,
    job_family,
    job_family_names,
    register_job_family,
    row_job_family,
    unregister_job_family,
)
from stare_verl.jobs.families.problems import Problem

pytestmark = pytest.mark.integration

SCORED: list[str] = []  # the texts the toy reward scored (the evaluation must call it, not envs.reward)
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def toy_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, Any]:
    """The toy family's reward: the last ``\\boxed{}`` equals the ground truth."""
    assert (extra_info or {}).get("family") == "toyguess"
    SCORED.append(solution_str)
    found = _BOXED.findall(solution_str or "")
    pred = found[-1].strip() if found else ""
    ok = pred == str(ground_truth).strip()
    return {"score": float(ok), "acc": ok, "pred": pred, "has_answer": bool(found)}


@dataclass(frozen=True)
class GuessDemo:
    """A single-turn demonstration that answers at once (the protocol of ``stare_verl.jobs.demo.sft.encode_demo``)."""

    problem: Problem

    @property
    def tools(self) -> None:
        return None

    def prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.problem.question}]

    def messages(self) -> list[dict[str, Any]]:
        return [*self.prompt(), {"role": "assistant", "content": self.assistant_texts()[0]}]

    def assistant_texts(self) -> list[str]:
        return [f"\\boxed{{{self.problem.answer}}}"]


def guess_demos(problems, seed: int = 0, per_problem: int = 1):
    return [GuessDemo(p) for p in problems for _ in range(per_problem)], []


TOY_ENV = EnvFamily(name="toyguess", agent_name="single_turn_agent", reward_module=__name__, reward_function="toy_score",
                    aliases=("toy_guess",))
TOY = JobFamily(
    env=TOY_ENV,
    task_table={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    demonstrations=guess_demos,
    accepts=lambda expression: "-" not in expression,
    demos_per_problem=2,
    sft_defaults={"steps": 7, "max_response_tokens": 16},
    min_sft_accuracy=0.1,
)


@pytest.fixture(autouse=True, scope="module")
def toy():
    register_env_family(TOY_ENV)
    register_job_family(TOY)
    yield TOY
    unregister_job_family(TOY.name)
    unregister_env_family(TOY_ENV.name)


def test_registry_names_it_and_refuses_a_second_one():
    assert job_family("toyguess") is TOY and TOY.env is env_family("toyguess") and not TOY.multi_turn
    assert job_family("toy_guess") is TOY and env_family("toy_guess") is TOY_ENV  # the alias
    assert job_family_names()[:3] == ("tooluse", "shortcot", "longcot") and "toyguess" in job_family_names()
    assert (TOY.cpu_recipe, TOY.compare_dir, TOY.eval_turns(3)) == ("toyguess_tiny", "compare-toyguess", 1)
    with pytest.raises(ValueError, match="already registered"):
        register_job_family(JobFamily(env=TOY_ENV, task_table=TOY.task_table, demonstrations=guess_demos))
    nowhere = EnvFamily(name="nowhere", agent_name="single_turn_agent", reward_module=__name__)
    with pytest.raises(ValueError, match="environment family is not registered"):
        register_job_family(JobFamily(env=nowhere, task_table=TOY.task_table, demonstrations=guess_demos))
    with pytest.raises(ValueError, match="already names 'toyguess'"):  # a spelling of another family
        register_env_family(EnvFamily(name="toy_guess", agent_name="single_turn_agent", reward_module=__name__))
    with pytest.raises(TypeError, match="EnvFamily"):
        JobFamily(env="toyguess", task_table=TOY.task_table, demonstrations=guess_demos)
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        job_family("nope")
    assert row_env_family("toy_guess", False) is TOY_ENV and row_env_family("toy_guess", True).name == "tooluse"
    assert row_job_family("toy_guess", False) is TOY


def test_data_path_problems_splits_and_rl_rows(tmp_path):
    from tests.support import demos as D

    sp = D.split_problems(n_train=8, n_heldout=4, seed=3, n_rl=6, family="toyguess")
    qs = [p.question for s in sp.values() for p in s]
    assert len(qs) == len(set(qs)) == 18 and all(p.task == "chain_sum" for s in sp.values() for p in s)
    assert all("-" not in p.expression for s in sp.values() for p in s)  # the family's filter
    paths = D.write_rl_parquet(tmp_path, n_train=6, n_val=4, seed=3, n_sft_train=8, n_heldout=4, family="toyguess")
    for df in (pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])):
        assert set(df["agent_name"]) == {"single_turn_agent"}
        assert {e["family"] for e in df["extra_info"]} == {"toyguess"}
        assert all("tools_kwargs" not in e for e in df["extra_info"])


def test_sft_data_path_config_key_demos_and_tokens(tmp_path):
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from envs.tiny_hf import build_tokenizer
    from stare_verl.jobs.demo import sft as S
    from tests.support.demos import split_problems

    cfg = S.SFTConfig(family="toyguess", n_train=8, n_heldout=4)
    assert (cfg.steps, cfg.max_response_tokens) == (7, 16)  # the family's SFT defaults
    key = S.key_config(cfg)["config"]
    assert key["family"] == "toyguess" and key["demos_per_problem"] == 2
    assert S.config_hash(cfg) != S.config_hash(S.SFTConfig(n_train=8, n_heldout=4))
    assert S.sft_problem_count(cfg) == 4
    with pytest.raises(ValueError, match="unknown family"):
        S.SFTConfig(family="nope")
    problems = split_problems(S.sft_problem_count(cfg), cfg.n_heldout, cfg.data_seed, family=cfg.family)["sft_train"]
    demos, rejected = S.build_family_demos(cfg, problems)
    assert len(demos) == 8 and rejected == []
    tok = build_tokenizer([S.render_demo(d) for d in demos], tmp_path / "tok")
    ids, mask = S.encode_demo(demos[0], tok, create_continuous_token_builder(tok, hf_model_type="qwen2"))
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == demos[0].assistant_texts()[0] + "<|im_end|>"


def test_evaluation_path_demo_episodes_score_with_the_familys_reward(tmp_path):
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from envs.tiny_hf import build_tokenizer
    from stare_verl.jobs.demo.evaluate import run_episodes
    from tests.support.demos import heldout_problems

    problems = heldout_problems(3, 1, family="toyguess")
    demos, _ = guess_demos(problems)
    from stare_verl.jobs.demo.sft import render_demo

    tok = build_tokenizer([render_demo(d) for d in demos], tmp_path / "tok")
    builder = create_continuous_token_builder(tok, hf_model_type="qwen2")
    answers = {}
    for i, d in enumerate(demos):
        text = d.assistant_texts()[0] if i != 1 else "\\boxed{-1}"
        answers[tuple(builder.build_initial_tokens(d.prompt(), tools=None))] = tok.encode(
            text, add_special_tokens=False) + [tok.eos_token_id]

    async def generate(prompt_ids, temperature, max_tokens, seed):
        return answers[tuple(prompt_ids)][:max_tokens]

    SCORED.clear()
    res = asyncio.run(run_episodes(problems, generate, tok, family="toyguess", max_response_tokens=16))
    assert [r.correct for r in res] == [True, False, True] and all(r.turns == 1 and r.tool_calls == 0 for r in res)
    assert len(SCORED) == 3 and res[0].extracted_answer == problems[0].answer


def test_evaluation_path_local_checkpoint_of_a_toy_sft(tmp_path):
    from stare_verl.jobs.evaluation import cli
    from stare_verl.jobs.evaluation.local import demo_family, heldout_data_for_sft
    from stare_verl.jobs.evaluation.runner import load_problems
    from tests.support.tiny import build_tiny_model

    ck = Path(build_tiny_model(tmp_path / "sft-toy"))
    (ck / "sft_config.json").write_text(json.dumps({"config": {"data_seed": 2, "n_heldout": 3, "family": "toyguess"}}))
    data = heldout_data_for_sft(ck, tmp_path / "d")
    probs = load_problems(data)
    assert len(probs) == 3 and {demo_family(p) for p in probs} == {"toyguess"} and not any(p.tool_use for p in probs)
    SCORED.clear()
    out = tmp_path / "out"
    assert cli.main(["--checkpoint", str(ck), "--data", str(data), "--k", "1", "--max-tokens", "8", "--no-progress",
                     "--out", str(out)]) == 0
    assert len(SCORED) == 3  # every sample scored by the toy reward


def test_the_clis_offer_it():
    from stare_verl.jobs.train import parse_options

    assert parse_options(["--family", "toyguess"]).family == "toyguess"
    assert parse_options(["--family", "toy_guess"]).family == "toyguess"  # the alias
    assert parse_options(["--family", "short_cot"]).job_family.name == "shortcot"
