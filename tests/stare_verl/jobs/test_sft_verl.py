"""Cold-start SFT with verl's own SFT trainer: the recipe, the multi-turn data, the loss mask verl's dataset
builds from it, and a real 3-step run of ``verl.trainer.sft_trainer`` on this CPU (torchrun, one rank)."""

import json
import os
import signal
import subprocess
import sys
import uuid

import pandas as pd
import pytest
import torch

from envs.tool_use import TOOL_USE_SYSTEM
from envs.tool_use.sft_data import (
    ConversationError,
    build_retool_sft,
    check_conversation,
    conversation_from_demo,
    load_retool_records,
    sft_row,
    write_sft_parquet,
)
from stare_verl.jobs import sft as L
from stare_verl.jobs.recipes import compose_recipe, recipes_dir
from tests.support import FIXTURES, REPO

pytestmark = pytest.mark.integration

FIXTURE = FIXTURES / "retool_sft_sample.jsonl"


def test_sft_recipe_composes_on_verls_sft_trainer_and_validates(monkeypatch):
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.delenv("SFT_DIR", raising=False)
    cfg = L.compose_sft()
    L.validate_sft(cfg, nproc=8, check_files=False)
    assert cfg.model._target_ == "verl.workers.config.HFModelConfig"  # verl's sft_trainer_engine underneath
    assert cfg.model.path == "Qwen/Qwen2.5-7B"
    assert (cfg.data.messages_key, cfg.data.tools_key) == ("messages", "tools")
    assert cfg.data.train_files == "data/sft/tooluse_train.parquet"
    assert (cfg.data.max_length, cfg.data.train_batch_size, cfg.data.truncation) == (16384, 32, "right")
    assert (cfg.optim.lr, cfg.optim.lr_scheduler_type, cfg.optim.lr_warmup_steps_ratio) == (1e-5, "cosine", 0.1)
    assert list(cfg.optim.betas) == [0.9, 0.95]
    assert (cfg.engine.strategy, cfg.engine.ulysses_sequence_parallel_size) == ("fsdp2", 4)
    assert cfg.trainer.total_epochs == 6 and "hf_model" in cfg.checkpoint.save_contents
    assert cfg.trainer.default_local_dir == "checkpoints/sft/qwen2.5-7b-tooluse-verl"
    # where the launcher links the final HF checkpoint is where the RL recipe loads its policy from
    monkeypatch.delenv("MODEL", raising=False)
    rl = compose_recipe("tooluse_qwen2.5-7b-sft_stare")
    assert rl.actor_rollout_ref.model.path == L.DEFAULT_LINK
    cmd = L.torchrun_command(L.DEFAULT_RECIPE, ["optim.lr=2e-5"], 8)
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=8",
                       "-m", "verl.trainer.sft_trainer", f"--config-path={recipes_dir() / 'sft'}",
                       "--config-name=tooluse_qwen2.5-7b", "optim.lr=2e-5"]


@pytest.mark.parametrize(
    ("overrides", "nproc", "match"),
    [
        (["optim.lr_scheduler_type=bogus"], 8, "FSDPOptimizerConfig"),
        (["+engine.bogus=1"], 8, "bogus"),
        (["engine.strategy=nope"], 8, "nope"),
        (["checkpoint.save_contents=[model,optimizer]"], 8, "hf_model"),
        ([], 6, "ulysses_sequence_parallel_size=4 must divide"),
        (["engine.ulysses_sequence_parallel_size=1", "data.train_batch_size=12"], 8, "multiple of the 8"),
        (["data.max_token_len_per_gpu=1024"], 8, "cannot hold one"),
    ],
)
def test_a_broken_sft_config_fails_before_launch(overrides, nproc, match):
    with pytest.raises(Exception, match=match):
        L.validate_sft(L.compose_sft(overrides=overrides), nproc=nproc, check_files=False)


def test_missing_data_file_says_how_to_build_it(tmp_path):
    cfg = L.compose_sft(overrides=[f"data.train_files={tmp_path}/none.parquet", "data.val_files=null"])
    with pytest.raises(FileNotFoundError, match="python -m stare_verl.jobs.sft data"):
        L.validate_sft(cfg, nproc=8)
    with pytest.raises(ValueError, match="model.path=..., data.train_files=..."):
        L.validate_sft(L.compose_sft("tooluse_tiny_cpu"), nproc=1)  # left to the command line


def test_retool_rows_convert_to_code_interpreter_calls_and_bad_rows_are_counted():
    rep = build_retool_sft(load_retool_records(FIXTURE))
    assert len(rep.rows) == 3 and rep.duplicates == 1
    assert dict(rep.reasons()) == {
        "code without interpreter output": 1, "unclosed <code>": 1, "final answer without \\boxed{}": 1,
        "source row has no [user, assistant] messages": 1, "no tool call": 1, "empty code block": 1,
    }
    assert [i for i, _ in rep.rejected] == [3, 4, 5, 6, 7, 9]
    two = rep.rows[1]["messages"]
    assert [m["role"] for m in two] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert two[0]["content"] == TOOL_USE_SYSTEM
    assert two[1]["content"] == "How many primes are there below 50?"  # instructions and <answer> tags gone
    calls = [m["tool_calls"][0]["function"] for m in two if m.get("tool_calls")]
    assert [c["name"] for c in calls] == ["code_interpreter", "code_interpreter"]
    assert calls[1]["arguments"] == {"code": "from sympy import primerange\nprint(len(list(primerange(2, 50))))"}
    assert two[2]["content"] == "Let me count them." and two[5]["content"] == "15"
    assert two[3]["content"] == "NameError: name 'primerang' is not defined"
    assert two[-1]["content"] == "There are \\boxed{15} primes below 50."
    assert rep.rows[0]["messages"][-1]["content"] == "The sum is 5050.\n\n\\boxed{5050}"
    assert rep.rows[2]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"code": "print(2**20)"}
    assert all(r["tools"][0]["function"]["name"] == "code_interpreter" for r in rep.rows)
    # rows of the wrong type are rejected, not raised
    odd = build_retool_sft([None, 7, {"messages": "text"}, {"messages": [{"role": "user"}, None]}])
    assert not odd.rows and len(odd.rejected) == 4


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: m.pop(3), "a tool call without its output"),
        (lambda m: m.__setitem__(-1, {"role": "assistant", "content": "15"}), "without \\\\boxed"),
        (lambda m: m.insert(4, dict(m[3])), "tool message where an assistant turn was expected"),
        (lambda m: m[2]["tool_calls"].append(m[2]["tool_calls"][0]), "more than one tool call"),
        (lambda m: m[2]["tool_calls"][0]["function"].update(name="shell"), "other than code_interpreter"),
        (lambda m: m[2]["tool_calls"][0]["function"].update(arguments='{"code": "1"}'), "without code"),
        (lambda m: m.pop(1), "no user question"),
    ],
)
def test_check_conversation_rejects_shapes_verl_or_the_agent_loop_would_not_reproduce(mutate, reason):
    msgs = conversation_from_demo("What is 2 + 3?", "print(2 + 3)", "5", "\\boxed{5}")
    check_conversation(msgs)
    mutate(msgs)
    with pytest.raises(ConversationError, match=reason):
        check_conversation(msgs)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny Qwen2 + byte-level tokenizer with the hermes chat template, trained on the SFT rows' text."""
    from envs.tiny_hf import build_model, build_tokenizer, save_model

    root = tmp_path_factory.mktemp("sft_verl")
    res = L.build_sft_data(root / "data", n_demos=24, demo_seed=5, retool_file=str(FIXTURE), n_val=2)
    rows = pd.read_parquet(res["train"]).to_dict(orient="records")
    corpus = [json.dumps(r["messages"].tolist(), default=str) for r in rows]
    tok = build_tokenizer(corpus, root / "tok")
    save_model(build_model(tok), tok, root / "model")
    return root, res, tok


def test_sft_data_builder_writes_both_sources(tiny_model):
    _, res, _ = tiny_model
    c = res["counts"]
    assert c["demos"] == {"kept": 24, "rejected": 0, "wrong_output": 0}
    assert (c["retool"]["kept"], c["retool"]["rejected"], c["retool"]["duplicates"]) == (3, 6, 1)
    assert (c["train"], c["val"]) == (25, 2)
    df = pd.concat([pd.read_parquet(res["train"]), pd.read_parquet(res["val"])])
    assert sorted(df["data_source"].str.split("/").str[0].value_counts().items()) == [("demo", 24),
                                                                                     ("retool_sft", 3)]


def test_rows_longer_than_max_length_tokens_are_dropped_and_counted(tiny_model, tmp_path):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    root, res, tok = tiny_model
    files = [str(res["train"]), str(res["val"])]
    data = MultiTurnSFTDataset(files, tok, {"max_length": 4096, "pad_mode": "no_padding"})
    lengths = sorted(len(data[i]["input_ids"]) for i in range(len(data)))
    cut = lengths[len(lengths) // 2]
    out = L.build_sft_data(tmp_path, n_demos=24, demo_seed=5, retool_file=str(FIXTURE), n_val=2,
                           tokenizer=str(root / "tok"), max_length=cut)
    assert out["counts"]["too_long"] == sum(n > cut for n in lengths) > 0
    kept = MultiTurnSFTDataset([str(out["train"]), str(out["val"])], tok, {"max_length": cut, "truncation": "error"})
    assert len(kept) == sum(n <= cut for n in lengths)
    assert all(int(kept[i]["attention_mask"].sum()) <= cut for i in range(len(kept)))  # "error" would raise


def test_step_budget_the_data_cannot_fill_fails_before_launch(tiny_model):
    root, res, _ = tiny_model  # 25 training rows
    base = [f"model.path={root / 'model'}", f"data.train_files={res['train']}"]
    L.validate_sft(L.compose_sft("tooluse_tiny_cpu", base), nproc=1, check_model=True)
    with pytest.raises(ValueError, match="make no batch"):
        L.validate_sft(L.compose_sft("tooluse_tiny_cpu", [*base, "data.train_batch_size=32"]), nproc=1)
    with pytest.raises(ValueError, match="exceeds the 3 steps"):
        L.validate_sft(L.compose_sft("tooluse_tiny_cpu", [*base, "trainer.total_training_steps=4"]), nproc=1)


def test_loss_mask_of_verls_dataset_covers_assistant_turns_only(tiny_model, tmp_path):
    """verl's MultiTurnSFTDataset on our parquet: loss_mask 1 exactly on each assistant turn (after its
    ``<|im_start|>assistant\\n``), 0 on system, user and tool tokens."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    _, _, tok = tiny_model
    rows = build_retool_sft(load_retool_records(FIXTURE)).rows
    demo = sft_row(conversation_from_demo("What is 12 * 7?", "print(12 * 7)", "84", "\\boxed{84}"), "demo/x")
    path = write_sft_parquet([*rows, demo], tmp_path / "sft.parquet")
    data = MultiTurnSFTDataset(str(path), tok, {"max_length": 1024, "pad_mode": "right", "truncation": "error"})
    assert len(data) == 4
    head = tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    gen_prompt = head[head.rindex("<|im_start|>"):]
    for i, row in enumerate([*rows, demo]):
        item = data[i]
        n = int(item["attention_mask"].sum())
        ids, mask = item["input_ids"][:n].tolist(), item["loss_mask"][:n].tolist()
        # the same tokens as the whole conversation rendered at once (verl asserts it too)
        assert tok.decode(ids) == tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        runs, cur = [], []
        for t, m in zip(ids, mask, strict=True):
            if m:
                cur.append(t)
            elif cur:
                runs.append(tok.decode(cur))
                cur = []
        if cur:
            runs.append(tok.decode(cur))
        expect = [tok.apply_chat_template([m], tokenize=False)[len(gen_prompt):]
                  for m in row["messages"] if m["role"] == "assistant"]
        assert runs == expect and all(r.endswith("<|im_end|>\n") for r in runs)
        masked_out = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        for m in row["messages"]:
            if m["role"] in ("tool", "user", "system"):
                assert m["content"] in masked_out
        assert f"<tool_response>\n{row['messages'][3]['content']}\n</tool_response>" in masked_out


def _kill_tagged(tag: str) -> list[int]:
    from stare_verl.jobs.procs import tagged_processes

    left = tagged_processes(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def test_verl_sft_trainer_runs_three_steps_on_cpu(tiny_model, tmp_path):
    """``python -m stare_verl.jobs.sft train --cpu-verl``: torchrun + verl.trainer.sft_trainer on the CPU platform,
    3 steps on the multi-turn parquet; the loss falls and an HF checkpoint with trained weights is linked."""
    from transformers import AutoModelForCausalLM

    root, res, _ = tiny_model
    tag = f"test-sft-verl-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "STARE_VERL_RUN_TAG": tag, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "stare_verl.jobs.sft", "train", "--cpu-verl", "--link", str(tmp_path / "sft-model"),
           f"model.path={root / 'model'}", f"data.train_files={res['train']}",
           f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = _kill_tagged(tag)
    assert proc.returncode == 0, out[-3000:]
    assert not left, f"processes left behind: {left}"
    (metrics,) = (tmp_path / "ckpt").glob("metrics-*.jsonl")
    losses = [json.loads(line)["data"]["train/loss"] for line in metrics.read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3, losses
    hf = tmp_path / "ckpt" / "global_step_3" / "huggingface"
    assert (tmp_path / "sft-model").resolve() == hf.resolve()
    assert f"checkpoint (HF): {tmp_path / 'sft-model'}" in out
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "sft-model", dtype=torch.float32)
    init = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
    emb = "model.embed_tokens.weight"
    assert not torch.equal(trained.state_dict()[emb], init.state_dict()[emb])
    assert (tmp_path / "sft-model" / "tokenizer.json").is_file()


def test_train_without_gpu_falls_back_to_the_cpu_demo_sft(monkeypatch, capsys):
    import stare_verl.jobs.demo.sft as demo_sft

    seen = []
    monkeypatch.setattr(L, "has_gpu", lambda: 0)
    monkeypatch.setattr(demo_sft, "main", lambda argv: seen.append(argv) or 0)
    assert L.main(["train", "--steps", "20", "--n-train=48"]) == 0
    assert seen == [["--steps", "20", "--n-train=48"]]
    assert L.main(["train", "--dry-run", "--steps", "20"]) == 0  # a dry run never trains, on this path either
    assert seen == [["--steps", "20", "--n-train=48"]]
    assert "would run the CPU default SFT" in capsys.readouterr().out
    assert L.main(["train", "optim.lr=1e-4"]) == 2  # Hydra overrides mean verl's trainer: not on this path
    assert "--cpu-verl" in capsys.readouterr().err
    assert L.main(["train", "--device", "gpu"]) == 2
    assert L.main(["train", "--model", "Qwen/Qwen2.5-7B"]) == 2  # the base model of the GPU recipe
    assert "--model is for verl's SFT trainer" in capsys.readouterr().err
    monkeypatch.setattr(L, "has_gpu", lambda: 8)
    assert L.main(["train", "--steps", "20"]) == 2  # an option verl's launcher does not know
    assert L.main(["train", "--dry-run", "--skip-model-check", "data.train_files=/nonexistent.parquet"]) == 2
    assert "python -m stare_verl.jobs.sft data" in capsys.readouterr().err
    assert L.main(["train", "--dry-run", "--skip-model-check", "optim.lr="]) == 2  # an empty value: before anything
    assert capsys.readouterr().err == ("error: override 'optim.lr=' gives optim.lr no value: write one, optim.lr=null "
                                       "for null or optim.lr='' for an empty string\n")  # fmt: skip


def test_gpu_dry_run_validates_and_prints_the_torchrun_command(tiny_model, monkeypatch, capsys, tmp_path):
    _, res, _ = tiny_model
    monkeypatch.setattr(L, "has_gpu", lambda: 8)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--dry-run", "--skip-model-check", "--model", "/models/qwen2.5-7b",
            f"data.train_files={res['train']}", f"data.val_files={res['val']}", "data.train_batch_size=8"]
    assert L.main(argv) == 0
    assert not (tmp_path / "checkpoints").exists()  # a dry run writes nothing
    out = capsys.readouterr().out
    assert "--nproc_per_node=8 -m verl.trainer.sft_trainer" in out and "--config-name=tooluse_qwen2.5-7b" in out
    assert out.rstrip().endswith(f"model.path=/models/qwen2.5-7b data.train_files={res['train']} "
                                 f"data.val_files={res['val']} data.train_batch_size=8")


def test_end_of_turn_becomes_an_eos_of_the_sft_checkpoint(tiny_model, tmp_path):
    import shutil

    from transformers import GenerationConfig

    root, _, tok = tiny_model
    hf = shutil.copytree(root / "model", tmp_path / "hf")
    eot, eot_base = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    GenerationConfig(eos_token_id=eot_base).save_pretrained(hf)  # as a base model ships it
    assert L.mark_end_of_turn(hf) is True
    assert GenerationConfig.from_pretrained(hf).eos_token_id == [eot, eot_base]
    assert L.mark_end_of_turn(hf) is False  # already there: unchanged
    assert L.mark_end_of_turn(hf, token="<|no_such_token|>") is False


def test_gpu_dry_run_without_cuda_prints_the_plan(tiny_model, monkeypatch, capsys, tmp_path):
    """``train --device gpu --dry-run`` where torch sees no CUDA device: the torchrun plan for --nproc GPUs (default
    8), validated; the model check only on a model that is here (a dry run downloads nothing); a real run is still
    refused (issue 32 item 4)."""
    _, res, _ = tiny_model
    monkeypatch.setattr(L, "has_gpu", lambda: 0)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # an empty cache: the hub id is not here
    monkeypatch.chdir(tmp_path)
    data = [f"data.train_files={res['train']}", f"data.val_files={res['val']}", "data.train_batch_size=8"]
    assert L.main(["train", "--device", "gpu", "--dry-run", *data]) == 0
    out = capsys.readouterr().out
    assert "dry run without a CUDA device here: planned for 8 GPUs on one node" in out
    assert "model check skipped: Qwen/Qwen2.5-7B is neither a local folder nor in the Hugging Face cache" in out
    assert "--nproc_per_node=8 -m verl.trainer.sft_trainer" in out and "--config-name=tooluse_qwen2.5-7b" in out
    assert out.rstrip().endswith(" ".join(data))
    assert L.main(["train", "--device", "gpu", "--dry-run", "--nproc", "4", *data]) == 0
    assert "--nproc_per_node=4 " in capsys.readouterr().out
    # a plan that would fail at launch: still printed, then the reason
    assert L.main(["train", "--device", "gpu", "--dry-run", "data.train_files=/nonexistent.parquet"]) == 2
    out, err = capsys.readouterr()
    assert "would run (but see the error below):" in out and "data.train_files=/nonexistent.parquet" in out
    assert "SFT data file /nonexistent.parquet not found" in err
    assert L.main(["train", "--device", "gpu", *data]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written
