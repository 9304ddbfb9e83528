"""Tool-use problems and demonstrations: real sandbox output, scoring 1.0, disjoint splits, RL parquet."""

import pandas as pd
import pytest

from envs.reward import compute_score
from tests.support import demos as D


@pytest.fixture(scope="module")
def splits():
    return D.split_problems(n_train=60, n_heldout=30, seed=3, n_rl=30)


@pytest.fixture(scope="module")
def built(splits):
    return D.build_demos(splits["sft_train"])


def test_task_mix_and_no_division(splits):
    train = splits["sft_train"]
    assert {p.task for p in train} == set(D.TASKS)
    assert sorted(sum(p.task == t for p in train) for t in D.TASKS) == [20, 20, 20]
    assert all("/" not in p.expression for p in train)
    assert len({p.question for p in train}) == len(train)


def test_demo_tool_outputs_are_the_real_values(built):
    demos, rejected = built
    assert len(demos) == 60 and rejected == []
    for d in demos:
        # independent check: the expression evaluated here, and the generator's own answer
        assert d.tool_output == str(eval(d.problem.expression, {"__builtins__": {}}))  # noqa: S307 - generated locally
        assert d.tool_output == d.problem.answer
        assert d.problem.code == f"print({d.problem.expression})"


def test_demo_answers_score_one(built):
    demos, _ = built
    for d in demos:
        model_text = "".join(d.assistant_texts())  # what the model generates (tool text excluded)
        s = compute_score(d.problem.data_source, model_text, d.problem.answer, {"family": "tool_use"})
        assert s["score"] == 1.0 and s["acc"] is True, (model_text, d.problem.answer)
        wrong = d.assistant_texts()[0] + f"\\boxed{{{int(d.problem.answer) + 1}}}"
        assert compute_score(d.problem.data_source, wrong, d.problem.answer, {"family": "tool_use"})["score"] == 0.0


def test_demo_messages_shape(built):
    d = built[0][0]
    msgs = d.messages()
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "code_interpreter",
                                                     "arguments": {"code": d.problem.code}}
    assert msgs[2]["content"] == d.tool_output
    assert msgs[3]["content"] == f"\\boxed{{{d.tool_output}}}"


def test_splits_are_disjoint_and_deterministic(splits):
    qs = {k: {p.question for p in v} for k, v in splits.items()}
    assert not qs["heldout"] & qs["sft_train"]
    assert not qs["heldout"] & qs["rl_train"]
    assert not qs["sft_train"] & qs["rl_train"]
    again = D.split_problems(n_train=60, n_heldout=30, seed=3, n_rl=30)
    assert again == splits
    assert D.heldout_problems(30, 3) == splits["heldout"]
    assert D.heldout_problems(30, 4) != splits["heldout"]
    # the SFT's dev split (early stop) is drawn last: the other splits stay as they were, and it is disjoint
    with_dev = D.split_problems(n_train=60, n_heldout=30, seed=3, n_rl=30, n_dev=20)
    assert {k: v for k, v in with_dev.items() if k != "sft_dev"} == splits and len(with_dev["sft_dev"]) == 20
    dev = {p.question for p in with_dev["sft_dev"]}
    assert len(dev) == 20 and not dev & (qs["heldout"] | qs["sft_train"] | qs["rl_train"])
    assert "sft_dev" not in D.split_problems(n_train=60, n_heldout=30, seed=3)


def test_schema_and_observations_are_the_tools_own():
    from envs.sandbox import ExecResult
    from envs.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

    assert D.CODE_INTERPRETER_SCHEMA == CODE_INTERPRETER_SCHEMA.model_dump(exclude_unset=True, exclude_none=True)
    assert D.format_observation(ExecResult(stdout="42\n", exit_code=0)) == "42"
    bad = ExecResult(stderr="Traceback (most recent call last):\n  File x\nZeroDivisionError: division by zero\n",
                     exit_code=1)
    assert D.format_observation(bad).endswith("ZeroDivisionError: division by zero")


def _tool_texts(codes):
    """What the code_interpreter tool itself returns for each program, run alone."""
    import asyncio

    from envs.tools.code_interpreter import CodeInterpreterTool

    async def run():
        tool = CodeInterpreterTool({"type": "native"})
        try:
            out = []
            for code in codes:
                iid, _ = await tool.create()
                resp, _, _ = await tool.execute(iid, {"code": code})
                await tool.release(iid)
                out.append(resp.text)
            return out
        finally:
            await tool.aclose()

    return asyncio.run(run())


def test_demo_tool_output_equals_running_the_tool(built):
    """The batched sandbox run gives what the code_interpreter tool returns for the demo's code alone."""


    demos = built[0][:4]
    assert _tool_texts([d.problem.code for d in demos]) == [d.tool_output for d in demos]


def test_sample_problems_rejects_negative():
    with pytest.raises(ValueError):
        D.sample_problems(-1, seed=0)


def test_rl_parquet_schema_and_splits(tmp_path, splits):
    paths = D.write_rl_parquet(tmp_path, n_train=30, n_val=20, seed=3, agent_name="stare_tool_agent",
                               n_sft_train=60, n_heldout=30)
    train, val = pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])
    assert len(train) == 30 and len(val) == 20
    for df in (train, val):
        assert set(df.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"}
        row = df.iloc[0]
        assert row["agent_name"] == "stare_tool_agent"
        assert row["data_source"].startswith("rg/")
        assert row["extra_info"]["need_tools_kwargs"]
        assert list(row["prompt"])[0]["role"] == "user"
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["family"] == "tooluse"
        assert "code_interpreter" in row["extra_info"]["tools_kwargs"]
    val_q = [list(p)[0]["content"] for p in val["prompt"]]
    assert val_q == [p.question for p in splits["heldout"][:20]]  # the SFT's held-out set
    train_q = [list(p)[0]["content"] for p in train["prompt"]]
    assert train_q == [p.question for p in splits["rl_train"]]  # disjoint from SFT and held-out (see above)
    assert list(val["reward_model"].map(lambda r: r["ground_truth"])) == [p.answer for p in splits["heldout"][:20]]
    with pytest.raises(ValueError):
        D.write_rl_parquet(tmp_path, n_train=5, n_val=40, n_heldout=30)


def test_rl_parquet_loads_in_verl_rlhf_dataset(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from envs.tiny_hf import build_tokenizer
    from stare_verl.jobs.demo.sft import render_demo

    ds, _ = D.build_demos(D.sample_problems(12, seed=1))
    tok = build_tokenizer([render_demo(d) for d in ds], tmp_path / "tok")
    paths = D.write_rl_parquet(tmp_path, n_train=6, n_val=3, seed=1, n_sft_train=12, n_heldout=3)
    cfg = OmegaConf.create({"max_prompt_length": 256, "return_raw_chat": True, "filter_overlong_prompts": False,
                            "cache_dir": str(tmp_path / "cache")})
    data = RLHFDataset(data_files=[str(paths["train"])], tokenizer=tok, config=cfg)
    assert len(data) == 6
    item = data[0]
    assert item["raw_prompt"][0]["role"] == "user"
    assert item["agent_name"] == "stare_tool_agent"
    assert item["tools_kwargs"]["code_interpreter"]["create_kwargs"]["data_source"] == item["data_source"]


def test_code_styles_are_drawn_per_demonstration_and_print_the_same_line(splits):
    """SFTConfig.code_styles: each demonstration's program is one of the first N CODE_STYLES, drawn by the seed;
    every style, run by the code_interpreter tool itself, shows what print(<expression>) shows."""
    import collections

    from stare_verl.jobs.families.tooluse import CODE_STYLES, _demonstrations

    problems = splits["sft_train"]
    demos, rejected = _demonstrations(problems, seed=5, code_styles=3)
    assert rejected == [] and len(demos) == len(problems)
    styles = collections.Counter(next(i for i, s in enumerate(CODE_STYLES) if s.format(expression=d.problem.expression)
                                      == d.program) for d in demos)  # fmt: skip
    assert set(styles) == {0, 1, 2} and min(styles.values()) >= 10  # 60 draws of 3 styles
    again, _ = _demonstrations(problems, seed=5, code_styles=3)
    assert [d.program for d in again] == [d.program for d in demos]  # deterministic for a seed
    other, _ = _demonstrations(problems, seed=6, code_styles=3)
    assert [d.program for d in other] != [d.program for d in demos]
    assert [d.program for d in _demonstrations(problems, seed=5, code_styles=1)[0]] == [p.code for p in problems]
    d = next(d for d in demos if d.program.endswith(", flush=True)"))
    assert d.messages()[1]["tool_calls"][0]["function"]["arguments"] == {"code": d.program}
    assert d.assistant_texts()[0].endswith(', flush=True)"}}</tool_call>')

    p = problems[0]
    shown = _tool_texts([s.format(expression=p.expression) for s in CODE_STYLES])
    assert shown == [p.answer] * len(CODE_STYLES)
    with pytest.raises(ValueError, match="code_styles"):
        _demonstrations(problems, code_styles=len(CODE_STYLES) + 1)


def test_code_styles_config_key_and_family_check():
    from stare_verl.jobs.demo.sft import SFTConfig, config_hash, key_config

    base = SFTConfig()
    assert "code_styles" not in key_config(base)["config"]  # the default's key is the one of before the field
    three = SFTConfig(code_styles=3)
    from stare_verl.jobs.families.tooluse import CODE_STYLES

    assert key_config(three)["config"]["code_styles"] == list(CODE_STYLES)  # the programs, not only their count
    assert config_hash(three) != config_hash(base) != config_hash(SFTConfig(code_styles=2))
    with pytest.raises(ValueError, match="code_styles is for tool use"):
        SFTConfig(family="shortcot", code_styles=2)
    with pytest.raises(ValueError):
        SFTConfig(code_styles=4)
