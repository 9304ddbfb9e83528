"""The tool-use family's pretrained-model task (``--model``): its variant, rows, recipes, the tool prompt of a
template that ignores ``tools=``, the warm start's encoding and cache key. Cheap: no model is run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from envs.tool_use.tool_prompt import TOOL_PROMPT_HEADER, template_renders_tools, with_tool_prompt
from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON
from stare_verl.jobs.families import job_family

REAL = Path(os.environ.get("STARE_CACHE_DIR", "/work/main/runs/cache")) / "models" / "smollm2-135m"
needs_real = pytest.mark.skipif(not (REAL / "tokenizer.json").is_file(),
                                reason=f"the prepared SmolLM2-135M-Instruct folder is absent ({REAL})")
PLACEHOLDERS = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                "trainer.default_local_dir=x"]


def test_variant_of_the_family():
    fam = job_family("tooluse").for_pretrained()
    assert fam.name == "tooluse" and fam.is_pretrained and fam.cpu_recipe == "tooluse_real"
    assert dict(fam.reward_options) == {"last_number": True} and fam.distinct_expressions
    assert fam.pretrained.sft_warm_start and fam.min_sft_accuracy == 0.0 and fam.multi_turn
    assert set(fam.task_table) == {"basic_arithmetic", "chain_sum", "products"}


def test_rows_disjoint_from_heldout_and_from_the_warm_start(tmp_path):
    from stare_verl.jobs.demo.sft import WarmStartConfig, warm_start_problems
    from stare_verl.jobs.pretrained import DATA_SEED, N_HELDOUT, PretrainedRun

    fam = job_family("tooluse").for_pretrained()
    run = PretrainedRun(family=fam, model=None, cache_dir=tmp_path, n_sft_train=64)
    paths = run.write_data(tmp_path, n_train=40, n_val=8)
    train, val = pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])
    assert len(train) == 40 and len(val) == 8
    row = train.iloc[0]
    assert [m["role"] for m in row["prompt"]] == ["user"]
    assert row["agent_name"] == "stare_tool_agent" and row["extra_info"]["family"] == "tooluse"
    assert row["extra_info"]["reward_options"] == {"last_number": True}
    assert "code_interpreter" in row["extra_info"]["tools_kwargs"]
    expr = lambda df: {r["expression"] for r in df["extra_info"]}  # noqa: E731
    warm = {p.expression for p in warm_start_problems(WarmStartConfig(model_dir=str(tmp_path), family="tooluse",
                                                                      n_demos=64, data_seed=DATA_SEED,
                                                                      n_heldout=N_HELDOUT))}
    assert len(warm) == 64 and not (warm & expr(train)) and not (warm & expr(val)) and not (expr(train) & expr(val))


@pytest.mark.parametrize("method, reweight", [("stare", None), ("grpo", 1.0)])
def test_recipes_compose_and_validate(method, reweight):
    from stare_verl.jobs.recipes import compose_recipe, validate_recipe

    cfg = compose_recipe(f"cpu/tooluse_real_{method}", PLACEHOLDERS)
    validate_recipe(cfg)
    ro = cfg.actor_rollout_ref.rollout
    assert (cfg.data.train_batch_size, ro.n, cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) == (8, 4, 8)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (256, 128)
    assert ro.multi_turn.enable and ro.multi_turn.max_assistant_turns == 3
    assert ro.agent.default_agent_loop == "stare_tool_agent"
    assert ro.multi_turn.tool_config_path.endswith("tool_use/tool_config.yaml")
    assert cfg.reward.custom_reward_function.path == "pkg://envs.tool_use.task"
    st = cfg.algorithm.stare
    assert (st.reweight_w == 1.0 and st.reweight_m == 1.0) == (reweight is not None)


def test_tool_prompt_only_for_templates_that_ignore_tools(tmp_path):
    from transformers import AutoTokenizer

    from envs.simulators import build_tiny_model_dir

    tiny = AutoTokenizer.from_pretrained(build_tiny_model_dir(tmp_path / "tiny"))
    assert template_renders_tools(tiny)
    msgs = [{"role": "user", "content": "q"}]
    assert with_tool_prompt(msgs, [CODE_INTERPRETER_SCHEMA_JSON], tiny) == msgs


@needs_real
def test_tool_prompt_on_the_real_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REAL)
    assert not template_renders_tools(tok)
    tools = [CODE_INTERPRETER_SCHEMA_JSON]
    out = with_tool_prompt([{"role": "user", "content": "q"}], tools, tok)
    assert [m["role"] for m in out] == ["system", "user"] and out[0]["content"].startswith(TOOL_PROMPT_HEADER)
    line = out[0]["content"].split("<tools>\n")[1].split("\n")[0]
    assert json.loads(line) == CODE_INTERPRETER_SCHEMA_JSON["function"]
    kept = with_tool_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}], tools, tok)
    assert kept[0]["content"].startswith("Be brief.\n\n" + TOOL_PROMPT_HEADER) and len(kept) == 2
    assert with_tool_prompt(kept, tools, tok) == kept  # once only
    assert with_tool_prompt([{"role": "user", "content": "q"}], None, tok) == [{"role": "user", "content": "q"}]
    with pytest.raises(ValueError, match="function.name"):
        with_tool_prompt([{"role": "user", "content": "q"}], [{"type": "function"}], tok)


@needs_real
def test_warm_start_encoding_on_the_real_template():
    from transformers import AutoTokenizer

    from stare_verl.jobs.demo.sft import encode_demo
    from stare_verl.jobs.families.problems import Problem
    from stare_verl.jobs.families.tooluse import Demo

    tok = AutoTokenizer.from_pretrained(REAL)
    p = Problem(task="products", question="What is 6 * 7?", answer="42", expression="6 * 7", index=0)
    demo = Demo(p, "42")
    ids, mask = encode_demo(demo, tok)
    call, answer = demo.assistant_texts()
    want_call = tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    want_answer = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
    obs = tok.encode("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    n = len(ids) - len(want_call) - len(obs) - len(want_answer)
    assert ids[n:] == want_call + obs + want_answer
    assert mask == [0] * n + [1] * len(want_call) + [0] * len(obs) + [1] * len(want_answer)
    assert tok.decode(ids[:n]).startswith("<|im_start|>system\n" + TOOL_PROMPT_HEADER)


def test_warm_start_cache_key_and_hit(tmp_path, capsys):
    from stare_verl.jobs.demo.sft import (
        WARM_CONFIG_FILE,
        WarmStartConfig,
        ensure_warm_start,
        warm_start_dir,
        warm_start_key,
    )

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    cfg = WarmStartConfig(model_dir=str(model), cache_dir=str(tmp_path / "cache"), steps=5)
    assert warm_start_dir(cfg) == warm_start_dir(cfg.model_copy(update={"num_threads": 3}))
    assert warm_start_dir(cfg) != warm_start_dir(cfg.model_copy(update={"steps": 6}))
    assert warm_start_dir(cfg) != warm_start_dir(cfg.model_copy(update={"lr": 1e-5}))
    d = warm_start_dir(cfg)
    (model / "model.safetensors").write_bytes(b"x" * 11)  # other weights: another key
    assert warm_start_dir(cfg) != d
    d = warm_start_dir(cfg)
    d.mkdir(parents=True)
    (d / WARM_CONFIG_FILE).write_text(json.dumps({"key": warm_start_key(cfg)}))
    assert ensure_warm_start(cfg) == d and "cache hit" in capsys.readouterr().err
    with pytest.raises(ValueError):
        WarmStartConfig(model_dir=str(model), steps=0)


def test_warm_start_steps_option():
    from stare_verl.jobs.train import (
        CPU_ONLY_OPTIONS,
        WARM_START_STEPS,
        OptionsError,
        TrainOptions,
        parse_options,
    )

    assert parse_options([]).warm_start_steps is None and WARM_START_STEPS >= 1
    assert parse_options(["--warm-start-steps", "5"]).warm_start_steps == 5
    with pytest.raises(OptionsError) as err:
        TrainOptions.parse({"warm_start_steps": 0})
    assert str(err.value).startswith("--warm-start-steps must be in [1, ") and str(err.value).endswith("] (got 0)")
    assert TrainOptions.parse({"warm_start_steps": None}).warm_start_steps is None
    assert "warm_start_steps" in CPU_ONLY_OPTIONS
