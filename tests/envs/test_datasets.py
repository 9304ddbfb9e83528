"""Dataset builders (envs.datasets) on small local fixture files, reasoning-gym offline sets, the CLI, and the
no-network failure path. No network is used: hub loads run in forced offline mode against an empty cache."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from envs.datasets import (
    SOURCES,
    DatasetUnavailableError,
    build_hub,
    build_offline,
    load_records,
    main,
    offline_tasks,
    write_parquet,
)
from envs.prompts import BOXED_INSTRUCTION, build_prompt
from envs.reward import compute_score
from envs.tool_use import TOOL_USE_SYSTEM
from tests.support import FIXTURES

FIX = FIXTURES


@pytest.fixture(scope="module", autouse=True)
def _close_scorer_workers():
    yield
    from envs.scoring import get_pool

    get_pool().close()  # math-verify workers started by the scorer checks


def _check_verl_row(row, split, family):
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["ability"] == "math"
    assert row["reward_model"]["style"] == "rule" and row["reward_model"]["ground_truth"]
    assert isinstance(row["prompt"], list) and row["prompt"][-1]["role"] == "user"
    assert row["extra_info"]["split"] == split and row["extra_info"]["family"] == family
    assert isinstance(row["extra_info"]["index"], int)


# ------------------------------------------------------------------------------------------ prompts


def test_prompt_templates():
    assert build_prompt("What is 1+1?") == [{"role": "user", "content": "What is 1+1?\n\n" + BOXED_INSTRUCTION}]
    assert BOXED_INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    qm = build_prompt("Q", style="qwen_math")
    assert qm == [{"role": "system", "content": BOXED_INSTRUCTION}, {"role": "user", "content": "Q"}]
    assert build_prompt("Q", family="long_cot", style="r1_distill")[0]["role"] == "user"
    assert build_prompt("Q", family="tool_use")[0] == {"role": "system", "content": TOOL_USE_SYSTEM}
    assert build_prompt("Q", family="tooluse", style="qwen_math") == build_prompt("Q", family="tool_use")
    for bad in ({"question": ""}, {"question": "Q", "family": "x"}, {"question": "Q", "style": "x"}):
        with pytest.raises(ValueError):
            build_prompt(**bad)


# ------------------------------------------------------------------------------- hub sources (local)


def test_gsm8k_from_file_reports_bad_rows_and_duplicates():
    rep = build_hub("gsm8k", "test", from_file=FIX / "gsm8k_sample.jsonl")
    assert [r["reward_model"]["ground_truth"] for r in rep.rows] == ["18", "2000", "120"]
    assert [(b.index, b.reason) for b in rep.bad] == [(2, "missing answer"), (3, "empty prompt/question")]
    assert rep.duplicates == 1
    for i, row in enumerate(rep.rows):
        _check_verl_row(row, "test", "shortcot")
        assert row["extra_info"]["index"] == i and row["data_source"] == "gsm8k"
    assert rep.rows[2]["extra_info"]["source_index"] == 4


def test_math500_from_file_keeps_metadata():
    rep = build_hub("math500", from_file=FIX / "math500_sample.jsonl", family="long_cot", style="r1_distill")
    assert [r["reward_model"]["ground_truth"] for r in rep.rows] == [r"\frac{3}{4}", r"2\sqrt{3}", r"[0,\infty)"]
    assert [(b.index, b.reason) for b in rep.bad] == [(2, "missing answer")]
    info = rep.rows[1]["extra_info"]
    assert (info["subject"], info["level"], info["source_id"]) == ("Algebra", 2, "test/algebra/0002.json")
    assert rep.rows[0]["prompt"][0]["content"].endswith(BOXED_INSTRUCTION)


def test_dapo_from_parquet_strips_answer_format_and_dedupes(tmp_path):
    recs = [json.loads(line) for line in (FIX / "dapo_sample.jsonl").read_text().splitlines()]
    pq = tmp_path / "dapo.parquet"
    pd.DataFrame(recs).to_parquet(pq)  # the hub file is parquet in verl format
    rep = build_hub("dapo_math", from_file=pq)
    assert rep.duplicates == 1 and [(b.index, b.reason) for b in rep.bad] == [(3, "missing answer")]
    q = rep.rows[0]["extra_info"]["question"]
    assert q == "How many positive divisors does $36$ have?"
    assert "Answer:" not in rep.rows[0]["prompt"][-1]["content"]
    assert rep.rows[1]["reward_model"]["ground_truth"] == "1208"
    assert rep.rows[0]["extra_info"]["family"] == "longcot"  # DAPO-Math defaults to long CoT


@pytest.mark.parametrize(
    "name, fixture, answers, bad",
    [
        ("aime2024", "aime2024_sample.jsonl", ["1", "60"], []),
        ("aime2025", "aime2025_sample.jsonl", ["29", "26"], [(2, "empty prompt/question")]),
    ],
)
def test_aime_from_file(name, fixture, answers, bad):
    rep = build_hub(name, from_file=FIX / fixture)
    assert [r["reward_model"]["ground_truth"] for r in rep.rows] == answers
    assert [(b.index, b.reason) for b in rep.bad] == bad
    for row in rep.rows:
        _check_verl_row(row, "test", "longcot")


def test_built_rows_score_with_our_reward():
    rep = build_hub("math500", from_file=FIX / "math500_sample.jsonl")
    for row, resp in zip(rep.rows, [r"\boxed{\dfrac{3}{4}}", r"\boxed{\sqrt{12}}", r"\boxed{[0, \infty)}"], strict=True):
        r = compute_score(row["data_source"], resp, row["reward_model"]["ground_truth"], row["extra_info"])
        assert r["score"] == 1.0, (resp, r)


def test_missing_local_file_and_bad_names(tmp_path):
    with pytest.raises(DatasetUnavailableError, match="not found"):
        load_records("aime2025", "test", from_file=tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DatasetUnavailableError, match="unsupported file type"):
        load_records("aime2025", "test", from_file=tmp_path / "x.txt")
    with pytest.raises(KeyError, match="unknown dataset"):
        load_records("mmlu", "test")
    with pytest.raises(KeyError, match="no split"):
        load_records("math500", "train")


def test_hub_without_network_or_cache_fails_fast_and_clearly(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(DatasetUnavailableError) as exc:
        load_records("aime2024", "test", offline=True, cache_dir=str(tmp_path / "hf"))
    assert time.perf_counter() - t0 < 30
    msg = str(exc.value)
    assert "HuggingFaceH4/aime_2024" in msg and "--from-file" in msg and "cache" in msg
    assert SOURCES["aime2025"].configs == ("AIME2025-I", "AIME2025-II")


# ------------------------------------------------------------------------------------- offline sets


OFFLINE_FAMILIES = ("shortcot", "longcot", "tooluse")


@pytest.mark.parametrize("family", OFFLINE_FAMILIES)
def test_offline_sets_are_deterministic_and_scoreable(family):
    a = build_offline(family, "train", n=24, seed=3)
    b = build_offline(family, "train", n=24, seed=3)
    assert [r["prompt"] for r in a.rows] == [r["prompt"] for r in b.rows]
    assert a.bad == [] and len(a.rows) + a.duplicates == 24
    tasks = {r["extra_info"]["task"] for r in a.rows}
    assert tasks == {t for t, _ in offline_tasks(family)}
    for i, row in enumerate(a.rows):
        _check_verl_row(row, "train", family)
        assert row["extra_info"]["index"] == i and row["data_source"] == f"rg/{row['extra_info']['task']}"
        gt = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], rf"\boxed{{{gt}}}", gt, row["extra_info"] | {"family": "short_cot"})[
            "score"
        ] == 1.0
    test = build_offline(family, "test", n=24, seed=3, exclude=[r["extra_info"]["question"] for r in a.rows])
    train_q = {r["extra_info"]["question"] for r in a.rows}
    assert not train_q & {r["extra_info"]["question"] for r in test.rows}


def test_offline_cli_writes_parquet_readable_by_datasets(tmp_path, capsys):
    rc = main(["offline", "--out", str(tmp_path), "--train-size", "14", "--test-size", "7", "--strict"])
    assert rc == 0
    out = capsys.readouterr().out
    for fam in OFFLINE_FAMILIES:
        for split in ("train", "test"):
            p = tmp_path / fam / f"rg_{split}.parquet"
            assert p.is_file() and f"offline {fam}/{split}" in out
    # verl's own dataset class reads it
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "cache")})
    ds = RLHFDataset(data_files=[str(tmp_path / "longcot" / "rg_train.parquet")], tokenizer=None, config=cfg)
    assert len(ds) == len(pd.read_parquet(tmp_path / "longcot" / "rg_train.parquet"))
    row = ds[0]
    assert row["raw_prompt"][0]["role"] == "user" and row["raw_prompt"][0]["content"].endswith(BOXED_INSTRUCTION)
    assert row["reward_model"]["style"] == "rule" and row["index"] == 0
    assert row["extra_info"]["family"] == "longcot" and row["extra_info"]["split"] == "train"


def test_hub_cli_from_file_and_clear_error(tmp_path, capsys):
    rc = main(["hub", "gsm8k", "--split", "test", "--from-file", str(FIX / "gsm8k_sample.jsonl"), "--out", str(tmp_path)])
    assert rc == 0 and (tmp_path / "shortcot" / "gsm8k_test.parquet").is_file()
    err = capsys.readouterr().err
    assert "bad row 2: missing answer" in err and "bad row 3: empty prompt/question" in err
    rc = main(["hub", "gsm8k", "--split", "test", "--from-file", str(FIX / "gsm8k_sample.jsonl"), "--out",
               str(tmp_path), "--strict"])
    assert rc == 1
    rc = main(["hub", "math500", "--from-file", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)])
    assert rc == 2 and "not found" in capsys.readouterr().err


def test_write_parquet_rejects_empty(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        write_parquet([], tmp_path / "x.parquet")
