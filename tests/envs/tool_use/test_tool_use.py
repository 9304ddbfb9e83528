"""Tool-use family: dataset rows (offline reasoning-gym, hub loaders), verl's dataset reading them, and the
reward entry point that scores only the model's own text."""

from __future__ import annotations

import ast
import operator

import pandas as pd
import pytest

from envs.tool_use import TOOL_USE_SYSTEM
from envs.tool_use.task import (
    AGENT_NAME,
    TOOL_STAT_KEYS,
    build_offline_tool_use,
    build_tool_use_hub,
    compute_score,
    main,
    strip_tool_turns,
    to_tool_use_row,
)
from tests.support import FIXTURES

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(expr: str) -> int:
    """Evaluate + - * and unary minus on integers (no eval())."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"unexpected node {ast.dump(node)}")

    return ev(ast.parse(expr, mode="eval"))


def _assert_tool_row(row: dict) -> None:
    assert row["agent_name"] == AGENT_NAME
    assert row["prompt"][0] == {"role": "system", "content": TOOL_USE_SYSTEM}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    info = row["extra_info"]
    assert info["family"] == "tooluse" and info["need_tools_kwargs"] is True
    assert set(info["tools_kwargs"]) == {"code_interpreter"}
    assert info["tools_kwargs"]["code_interpreter"]["create_kwargs"] == {"data_source": row["data_source"]}


def test_offline_set_mixes_tasks_and_expressions_give_the_answer():
    rep = build_offline_tool_use("train", n=30, seed=3)
    assert len(rep.rows) == 30 and not rep.bad
    tasks = [r["extra_info"]["task"] for r in rep.rows]
    assert {t: tasks.count(t) for t in set(tasks)} == {
        "basic_arithmetic": 10,
        "chain_sum": 10,
        "products": 10,
    }
    for i, row in enumerate(rep.rows):
        _assert_tool_row(row)
        assert row["data_source"] == f"rg/{row['extra_info']['task']}" and row["extra_info"]["index"] == i
        expr = row["extra_info"]["expression"]
        assert "/" not in expr
        assert _eval(expr) == int(row["reward_model"]["ground_truth"])  # running the code gives the answer


def test_offline_test_split_is_disjoint_and_bad_arguments_raise():
    train = build_offline_tool_use("train", n=24)
    qs = {r["extra_info"]["question"] for r in train.rows}
    test = build_offline_tool_use("test", n=24, exclude=qs)
    assert not qs & {r["extra_info"]["question"] for r in test.rows}
    assert build_offline_tool_use("train", n=24).rows == train.rows  # deterministic
    with pytest.raises(ValueError, match="unknown split"):
        build_offline_tool_use("dev", n=3)
    with pytest.raises(ValueError, match="n must be"):
        build_offline_tool_use("train", n=0)


def test_hub_rows_from_local_file_and_row_conversion():
    rep = build_tool_use_hub("aime2024", from_file=FIXTURES / "aime2024_sample.jsonl")
    assert len(rep.rows) == 2
    for row in rep.rows:
        _assert_tool_row(row)
        assert row["data_source"] == "aime2024"
    src = {
        "data_source": "x",
        "prompt": [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}],
        "extra_info": {"index": 0},
    }
    out = to_tool_use_row(src, create_kwargs={"k": 1})
    assert src["prompt"][0]["content"] == "old"  # input unchanged
    assert out["prompt"][0]["content"] == TOOL_USE_SYSTEM and out["extra_info"]["tools_kwargs"][
        "code_interpreter"
    ] == {"create_kwargs": {"k": 1}}
    with pytest.raises(ValueError, match="user message"):
        to_tool_use_row({"prompt": [{"role": "system", "content": "s"}]})


def test_cli_offline_writes_parquet_that_verl_dataset_reads(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from envs.simulators import build_tiny_tokenizer

    assert main(["offline", "--out", str(tmp_path), "--n-train", "6", "--n-test", "3"]) == 0
    train = tmp_path / "tooluse" / "rg_arith_train.parquet"
    assert len(pd.read_parquet(train)) == 6
    assert len(pd.read_parquet(tmp_path / "tooluse" / "rg_arith_test.parquet")) == 3
    aime = FIXTURES / "aime2024_sample.jsonl"
    assert main(["hub", "aime2024", "--out", str(tmp_path), "--from-file", str(aime)]) == 0
    hub = pd.read_parquet(tmp_path / "tooluse" / "aime2024_test.parquet")
    assert len(hub) == 2 and set(hub["agent_name"]) == {AGENT_NAME}
    cfg = OmegaConf.create({"max_prompt_length": 2048, "filter_overlong_prompts": False})
    ds = RLHFDataset(data_files=[str(train)], tokenizer=build_tiny_tokenizer(), config=cfg, processor=None)
    item = ds[0]
    assert item["agent_name"] == AGENT_NAME
    assert item["tools_kwargs"] == {
        "code_interpreter": {"create_kwargs": {"data_source": item["data_source"]}}
    }
    assert item["raw_prompt"][0]["content"] == TOOL_USE_SYSTEM


def test_cli_refuses_a_missing_input_file_with_status_2(tmp_path, capsys):
    """A missing --from-file is the caller's input: refused as a usage error (2, as envs.datasets), nothing written."""
    assert (
        main(["hub", "aime2024", "--out", str(tmp_path), "--from-file", str(tmp_path / "missing.jsonl")]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: DatasetUnavailableError") and "missing.jsonl" in err
    assert not list(tmp_path.rglob("*.parquet"))


def test_compute_score_uses_model_text_not_tool_output():
    leaked = "Let me check.<tool_call>{}</tool_call>\nuser\n<tool_response>\n\\boxed{42}\n</tool_response>\nI am not sure."
    info = {
        "model_response_text": "Let me check.\nI am not sure.",
        "num_tool_calls": 1,
        "tool_time_s": 0.25,
        "hit_eos": True,
        "response_length": 20,
    }
    res = compute_score("t", leaked, "42", info)
    assert res["score"] == 0.0 and res["reward_text_from_loop"] is True
    assert res["num_tool_calls"] == 1 and res["tool_time_s"] == 0.25 and res["num_tool_errors"] == 0
    good = compute_score("t", leaked, "42", {**info, "model_response_text": "so \\boxed{42}"})
    assert good["score"] == 1.0 and good["acc"] is True
    assert set(res) == set(good)  # the same keys every call (verl stacks them)
    assert set(TOOL_STAT_KEYS) <= set(res)
    assert list(TOOL_STAT_KEYS) == [  # EpisodeStats.counters()'s numbers, num_tool_exceptions included
        "num_assistant_turns", "num_tool_calls", "num_tool_executed", "num_malformed_calls", "num_tool_exceptions",
        "num_tool_timeouts", "num_tool_errors", "tool_time_s",
    ]  # fmt: skip
    assert all(v == 0 for v in TOOL_STAT_KEYS.values()) and isinstance(TOOL_STAT_KEYS["tool_time_s"], float)
    # a truncated episode (hit_eos False) earns nothing even with a box in the model text
    assert (
        compute_score("t", "", "42", {**info, "model_response_text": "\\boxed{42}", "hit_eos": False})[
            "score"
        ]
        == 0.0
    )


def test_compute_score_fallback_strips_tool_blocks():
    leaked = 'Let me check.<tool_call>{"code": "print(r\'\\\\boxed{42}\')"}</tool_call>\n<tool_response>\n\\boxed{42}\n</tool_response>'
    assert strip_tool_turns(leaked) == "Let me check.\n"
    res = compute_score("t", leaked, "42", {"index": 3})
    assert res["score"] == 0.0 and res["reward_text_from_loop"] is False and res["num_tool_calls"] == 0
    assert compute_score("t", leaked + " so \\boxed{42}", "42", None)["score"] == 1.0
    assert strip_tool_turns("a<tool_response>cut off") == "a"
