"""Cold-start SFT: assistant-only loss mask, cache keyed by configuration, a short run that lowers the loss."""

import dataclasses
import json

import pandas as pd
import pytest
import torch

from envs.tiny_hf import TinyModelConfig, build_model, build_tokenizer
from stare_verl.jobs.demo import sft as S
from stare_verl.jobs.demo.evaluate import evaluate_checkpoint
from stare_verl.jobs.demo.sft_trainer import collate_demos
from tests.support.demos import CODE_INTERPRETER_SCHEMA, build_demos, sample_problems, split_problems

pytestmark = pytest.mark.integration

TINY = dict(n_train=48, n_heldout=3, steps=20, batch_size=8, lr=3e-3, warmup_steps=2, progress=False,
            eval_temperatures=(0.0,), max_response_tokens=32, num_threads=1, stop_accuracy=None,
            anneal_below_loss=None)


@pytest.fixture(scope="module")
def demos_tok(tmp_path_factory):
    demos, _ = build_demos(sample_problems(12, seed=21))
    tok = build_tokenizer([S.render_demo(d) for d in demos], tmp_path_factory.mktemp("tok"))
    return demos, tok


def test_loss_mask_covers_exactly_the_assistant_tokens(demos_tok):
    demos, tok = demos_tok
    for d in demos:
        ids, mask = S.encode_demo(d, tok)
        assert len(ids) == len(mask)
        # the same ids as rendering the whole conversation with the chat template (minus its final newline)
        full = tok.apply_chat_template(d.messages(), tools=[CODE_INTERPRETER_SCHEMA], tokenize=False)
        assert tok.decode(ids) == full[: -len("\n")]
        runs, cur = [], []
        for t, m in zip(ids, mask, strict=True):
            if m:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        runs.append(cur)
        call, answer = d.assistant_texts()
        assert [tok.decode(r) for r in runs] == [call + "<|im_end|>", answer + "<|im_end|>"]
        masked_out = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert d.problem.question in masked_out and f"<tool_response>\n{d.tool_output}\n</tool_response>" in masked_out


def test_collate_pads_and_ignores_non_assistant_tokens(demos_tok):
    demos, tok = demos_tok
    rows = [S.encode_demo(d, tok) for d in demos[:3]]
    batch = collate_demos(tok.pad_token_id)([{"input_ids": i, "loss_mask": m} for i, m in rows])
    width = max(len(i) for i, _ in rows)
    assert batch["input_ids"].shape == (3, width)
    for b, (ids, mask) in enumerate(rows):
        n = len(ids)
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (width - n)
        expect = [t if m else -100 for t, m in zip(ids, mask, strict=True)] + [-100] * (width - n)
        assert batch["labels"][b].tolist() == expect


def test_model_is_the_calibrated_size_and_deterministic(demos_tok):
    _, tok = demos_tok
    a, b, c = build_model(tok, seed=1), build_model(tok, seed=1), build_model(tok, seed=2)
    n = sum(p.numel() for p in a.parameters())
    assert 0.80e6 < n < 0.88e6  # ~0.84 M with a 384-token vocabulary, tied embeddings
    assert a.config.tie_word_embeddings and a.config.num_key_value_heads == 2 and a.config.model_type == "qwen2"
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    with pytest.raises(ValueError):
        build_model(tok, TinyModelConfig(hidden_size=130, num_attention_heads=4))


def test_config_hash_covers_what_changes_the_checkpoint():
    base = S.SFTConfig()
    assert S.config_hash(base) == S.config_hash(S.SFTConfig())
    for change in ({"lr": 1e-3}, {"steps": 999}, {"data_seed": 1}, {"n_train": 100}, {"batch_size": 16},
                   {"init_seed": 3}, {"model": TinyModelConfig(num_hidden_layers=3)}, {"model": TinyModelConfig()},
                   {"vocab_size": 400}):
        assert S.config_hash(base.model_copy(update=change)) != S.config_hash(base), change
    for same in ({"cache_dir": "/x"}, {"num_threads": 1}, {"progress": False}, {"eval_every": 50}):
        assert S.config_hash(base.model_copy(update=same)) == S.config_hash(base), same
    with pytest.raises(ValueError):
        S.SFTConfig(steps=0)
    with pytest.raises(ValueError, match="exceed steps"):
        S.SFTConfig(steps=100, warmup_steps=20, decay_steps=81)
    # decay_steps is in the key when it is used, and an explicit 0 is the constant-lr key of before
    assert S.config_hash(base.model_copy(update={"decay_steps": 100})) != S.config_hash(base)
    assert "decay_steps" not in S.key_config(S.SFTConfig(decay_steps=0))["config"]
    with pytest.raises(ValueError):
        S.SFTConfig(unknown=1)


def test_tiny_sft_lowers_loss_and_cache_hit_miss(tmp_path, monkeypatch, capsys):
    cfg = S.SFTConfig(cache_dir=str(tmp_path), **TINY)
    path = S.ensure_sft_checkpoint(cfg)
    assert path == tmp_path / f"sft-{S.config_hash(cfg)}"
    rep = S.read_report(path)
    assert rep["steps"] == 20 and rep["n_demos"] == 48
    assert rep["final_loss"] < 0.6 * rep["first_loss"], rep["loss"]
    lr = dict(rep["lr"])  # constant after the warm-up of 2 steps
    assert lr[2] == pytest.approx(cfg.lr / 2) and lr[4] == pytest.approx(cfg.lr) and lr[20] == pytest.approx(cfg.lr)
    held = rep["heldout"]["T=0.0"]
    assert held["n"] == 3 and 0.0 <= held["accuracy"] <= 1.0
    assert json.loads((path / S.CONFIG_FILE).read_text())["hash"] == S.config_hash(cfg)
    model, tok = S.load_checkpoint(path)
    assert model.config.vocab_size == len(tok) == 484  # tool use: 384 + the 100 two-digit groups
    assert not list(tmp_path.glob(".sft-*"))  # no temporary directory left behind

    # the held-out set is found again from the checkpoint's sft_config.json; greedy decoding reproduces
    reps = evaluate_checkpoint(path, temperatures=(0.0,))
    assert reps[0.0].n == 3
    assert (reps[0.0].accuracy, reps[0.0].mean_turns) == (held["accuracy"], held["mean_turns"])

    # RL data for this SFT: val = its held-out problems, train disjoint from its demonstrations
    paths = S.write_rl_data(cfg, tmp_path / "rl", n_train=5)
    val_q = [list(p)[0]["content"] for p in pd.read_parquet(paths["val"])["prompt"]]
    train_q = {list(p)[0]["content"] for p in pd.read_parquet(paths["train"])["prompt"]}
    splits = split_problems(cfg.n_train, cfg.n_heldout, cfg.data_seed)
    assert val_q == [p.question for p in splits["heldout"]]
    assert len(train_q) == 5 and not train_q & {p.question for p in splits["sft_train"]} and not train_q & set(val_q)

    # hit: same configuration (run-only knobs may differ) -> same directory, no training
    def no_training(*a, **k):
        raise AssertionError("trained although the checkpoint is cached")

    monkeypatch.setattr(S, "train_sft", no_training)
    assert S.ensure_sft_checkpoint(cfg.model_copy(update={"progress": True, "num_threads": 2})) == path
    # the CLI with the same settings reuses it and prints the held-out accuracy
    argv = ["--out", str(tmp_path), "--steps", "20", "--n-train", "48", "--n-heldout", "3", "--batch-size", "8",
            "--lr", "3e-3", "--warmup-steps", "2", "--max-response-tokens", "32", "--threads", "1",
            "--anneal-below-loss", "off"]
    assert S.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint: {path}" in printed and f"held-out T=0.0: accuracy {held['accuracy']:.3f} (n 3)" in printed
    # exit 2 below the bar (a bar in [0, 1]: the CLI refuses others, test_sft_cli_rejects_bad_settings...)
    assert S.main(argv + ["--min-accuracy", f"{held['accuracy']}"]) == 0
    if held["accuracy"] < 1.0:
        assert S.main(argv + ["--min-accuracy", "1"]) == 2
    # miss: another configuration trains (here: reaches the patched trainer)
    with pytest.raises(AssertionError, match="trained although"):
        S.ensure_sft_checkpoint(cfg.model_copy(update={"lr": 1e-3}))
    # an incomplete directory (no report) is not a hit
    (path / S.REPORT_FILE).unlink()
    with pytest.raises(AssertionError, match="trained although"):
        S.ensure_sft_checkpoint(cfg)
    assert not list(tmp_path.glob(".sft-*"))


def test_multiturn_sft_parquet_loads_in_verls_sft_dataset(demos_tok, tmp_path):
    """The same demonstrations in verl's MultiTurnSFTDataset layout (for verl's own SFT trainer)."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from envs.tool_use.sft_data import sft_row, write_sft_parquet

    demos, tok = demos_tok
    rows = [sft_row(d.messages(), d.problem.data_source) for d in demos[:3]]  # envs.tool_use's writer, one path
    data = MultiTurnSFTDataset(str(write_sft_parquet(rows, tmp_path / "sft.parquet")), tok, {"max_length": 256})
    assert len(data) == 3
    nl = tok.encode("\n", add_special_tokens=False)
    for i, d in enumerate(demos[:3]):
        item = data[i]
        n = int(item["attention_mask"].sum())
        ids, lm = item["input_ids"][:n].tolist(), item["loss_mask"][:n].tolist()
        ours, mask = S.encode_demo(d, tok)
        assert ids == ours + nl  # verl's dataset keeps the template's final newline
        # verl also trains on the newline after each <|im_end|>; the agent loop never samples it (mask 0 there)
        call, answer = d.assistant_texts()
        assert tok.decode([t for t, m in zip(ids, lm, strict=True) if m]) == (
            f"{call}<|im_end|>\n{answer}<|im_end|>\n"
        )
    with pytest.raises(ValueError):
        write_sft_parquet([], tmp_path / "empty.parquet")


def test_decay_steps_end_the_sft_with_a_linear_decay_to_zero(tmp_path):
    cfg = S.SFTConfig(cache_dir=str(tmp_path), **{**TINY, "decay_steps": 6})
    rep = S.read_report(S.ensure_sft_checkpoint(cfg))
    # the lr of step n (logged every 2 steps): warm-up over 2 steps, constant to step 14, then falling by lr / 6
    # a step, so that it would reach 0 after the last step (transformers' warmup_stable_decay, linear)
    lr = dict(rep["lr"])
    assert lr[2] == pytest.approx(cfg.lr / 2) and lr[10] == pytest.approx(cfg.lr) and lr[14] == pytest.approx(cfg.lr)
    assert [lr[n] / cfg.lr for n in (16, 18, 20)] == pytest.approx([5 / 6, 3 / 6, 1 / 6])
    assert S.config_hash(cfg) != S.config_hash(cfg.model_copy(update={"decay_steps": 0}))


def test_early_stop_ends_the_sft_at_the_first_dev_check_that_reaches_stop_accuracy(tmp_path, monkeypatch):
    from stare_verl.jobs.demo import evaluate as E

    real = E.evaluate_model
    dev_accuracy = iter([0.0, 0.5, 0.75, 1.0])  # what the dev checks at steps 5, 10, 15, 20 would see
    dev_sizes = []

    def fake(model, tokenizer, problems, temperatures=(0.0, 1.0), **kw):
        if len(problems) != 4:  # the held-out evaluation (3 problems) runs for real
            return real(model, tokenizer, problems, temperatures, **kw)
        dev_sizes.append(len(problems))
        rep = real(model, tokenizer, problems[:1], (0.0,), **kw)[0.0][0]
        return {0.0: (dataclasses.replace(rep, accuracy=next(dev_accuracy)), [])}

    monkeypatch.setattr(E, "evaluate_model", fake)
    cfg = S.SFTConfig(cache_dir=str(tmp_path), **{**TINY, "stop_accuracy": 0.7, "check_every": 5, "n_dev": 4})
    rep = S.read_report(S.ensure_sft_checkpoint(cfg))
    assert (rep["steps"], rep["max_steps"], rep["stopped_at"]) == (15, 20, 15)
    assert rep["checks"] == [{"step": 5, "dev_greedy_acc": 0.0}, {"step": 10, "dev_greedy_acc": 0.5},
                             {"step": 15, "dev_greedy_acc": 0.75}]
    assert dev_sizes == [4, 4, 4] and rep["heldout"]["T=0.0"]["n"] == 3
    assert max(step for step, _ in rep["loss"]) <= 15
    # never reached: all steps, no stop
    dev_accuracy = iter([0.0] * 3)
    rep = S.read_report(S.ensure_sft_checkpoint(cfg.model_copy(update={"stop_accuracy": 0.9})))
    assert (rep["steps"], rep["stopped_at"], len(rep["checks"])) == (20, None, 3)


def test_early_stop_config_and_cache_key():
    base = S.SFTConfig(family="shortcot")
    # off: the key is the one of before the early stop existed (its other fields are not in it)
    assert not {"stop_accuracy", "check_every", "n_dev"} & set(S.key_config(base)["config"])
    assert S.config_hash(base.model_copy(update={"check_every": 7})) == S.config_hash(base)
    on = base.model_copy(update={"stop_accuracy": 0.8})
    assert S.config_hash(on) != S.config_hash(base)
    assert S.config_hash(on.model_copy(update={"check_every": 50})) != S.config_hash(on)
    assert S.config_hash(on.model_copy(update={"n_dev": 32})) != S.config_hash(on)
    for bad in ({"stop_accuracy": 0.0}, {"stop_accuracy": 1.5}, {"stop_accuracy": float("nan")}, {"check_every": 0},
                {"n_dev": 0}, {"n_dev": 4097}, {"stop_accuracy": 0.8, "decay_steps": 100}):
        with pytest.raises(ValueError):
            S.SFTConfig(**bad)
    # an early stop that could never check is an error, not a silent no-op
    with pytest.raises(ValueError, match="no dev check would run"):
        S.SFTConfig(stop_accuracy=0.5, steps=100)
    with pytest.raises(ValueError, match="no dev check would run"):
        S.SFTConfig(stop_accuracy=0.5, steps=1000, check_every=1000)
    assert S.SFTConfig(stop_accuracy=0.5, steps=101).check_every == 100


@pytest.mark.parametrize("argv, message", [
    (["--stop-accuracy", "0.5", "--decay-steps", "10", "--anneal-below-loss", "off"],
     "cannot be combined with decay_steps"),
    (["--decay-steps", "10"], "anneal-below-loss off"),
    (["--anneal-below-loss", "-1"], "expected 'off' or a number > 0"),
    (["--vocab-size", "300"], "vocab_size 300 is below 365"),
    (["--train-seed", "-1"], "train_seed: Input should be greater than or equal to 0"),
    (["--stop-accuracy", "0.5", "--steps", "50"], "no dev check would run"),
    (["--steps", "0"], "steps: Input should be greater than or equal to 1"),
    (["--stop-accuracy", "2"], "expected 'off' or a number in (0, 1]"),
    (["--n-dev", "0", "--stop-accuracy", "0.5"], "n_dev: Input should be greater than or equal to 1"),
    # a threshold that would switch its own check off: NaN compares false, so a NaN bar passes every checkpoint
    (["--min-accuracy", "nan"], "expected a number in [0, 1], got 'nan'"),
    (["--min-accuracy", "1.5"], "expected a number in [0, 1], got '1.5'"),
    (["--min-accuracy", "high"], "expected a number in [0, 1], got 'high'"),
    (["--warmup-steps", "2000", "--steps", "1000"], "--warmup-steps 2000 exceeds the run's 1000 steps"),
])
def test_sft_cli_rejects_bad_settings_with_a_usage_error(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        S.main(["--out", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing trained
    # off by default (issue 16: with 0.9 on 128 dev problems the default seed never stopped before 1500 steps)
    assert S.SFTConfig().stop_accuracy is None and S.SFTConfig(stop_accuracy=0.85).n_dev == 64


def test_anneal_lr_factor_warms_up_holds_then_falls_linearly_to_its_floor():
    cfg = S.SFTConfig(warmup_steps=4, anneal_below_loss=0.1, anneal_steps=10, anneal_final_lr_ratio=0.2)
    f = S.anneal_lr_factor
    assert [f(s, cfg, None) for s in (0, 2, 4, 500)] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert [f(s, cfg, 100) for s in (100, 101, 105, 110, 120)] == pytest.approx([1.0, 0.92, 0.6, 0.2, 0.2])


def test_anneal_starts_when_the_logged_loss_falls_below_the_bar_and_ends_the_sft(tmp_path):
    # a bar above any loss: the anneal starts at the first log (step 2) and the run ends 6 steps later
    cfg = S.SFTConfig(cache_dir=str(tmp_path), **{**TINY, "anneal_below_loss": 100.0, "anneal_steps": 6,
                                                  "anneal_final_lr_ratio": 0.25})
    rep = S.read_report(S.ensure_sft_checkpoint(cfg))
    assert (rep["anneal_from"], rep["steps"], rep["max_steps"]) == (2, 8, 20)
    lr = dict(rep["lr"])
    assert sorted(lr) == [2, 4, 6, 8]
    # the lr logged at step n is the one step n used, anneal_lr_factor(n - 1): falling by 0.75 / 6 a step after
    # step 2, reaching 0.25 x just after the last step (as decay_steps reaches 0)
    assert [lr[n] / cfg.lr for n in (4, 6, 8)] == pytest.approx([1 - 0.75 * k / 6 for k in (1, 3, 5)])
    # a bar below any loss of 20 steps: constant lr to the end, no anneal
    rep = S.read_report(S.ensure_sft_checkpoint(cfg.model_copy(update={"anneal_below_loss": 1e-6})))
    assert (rep["anneal_from"], rep["steps"]) == (None, 20)
    assert [v for n, v in rep["lr"] if n > 2] == pytest.approx([cfg.lr] * 9)


def test_anneal_config_cache_key_and_tool_use_defaults():
    tool = S.SFTConfig()
    assert (tool.anneal_below_loss, tool.steps, tool.digits_per_token, tool.vocab_size) == (0.1, 1300, 2, 484)
    assert {"anneal_below_loss", "anneal_steps", "anneal_final_lr_ratio", "digits_per_token"} <= set(
        S.key_config(tool)["config"])
    assert S.config_hash(tool.model_copy(update={"anneal_steps": 200})) != S.config_hash(tool)
    short = S.SFTConfig(family="shortcot")  # off: the key is the one of before the fields existed
    assert short.anneal_below_loss is None and short.digits_per_token == 1
    assert not {"anneal_below_loss", "anneal_steps", "anneal_final_lr_ratio", "digits_per_token"} & set(
        S.key_config(short)["config"])
    assert S.config_hash(short.model_copy(update={"anneal_steps": 7})) == S.config_hash(short)
    with pytest.raises(ValueError, match="anneal-below-loss off"):
        S.SFTConfig(decay_steps=100)  # tool use anneals by default: a second schedule is refused, naming the fix
    assert S.SFTConfig(decay_steps=100, anneal_below_loss=None).decay_steps == 100
    for bad in ({"anneal_below_loss": 0.0}, {"anneal_below_loss": float("inf")}, {"anneal_steps": 0},
                {"anneal_final_lr_ratio": 1.5}, {"digits_per_token": 0}, {"digits_per_token": 4},
                {"vocab_size": 300}, {"digits_per_token": 3, "vocab_size": 500}, {"train_seed": -1},
                {"init_seed": 2**32}, {"data_seed": -1}):
        with pytest.raises(ValueError):
            S.SFTConfig(**bad)
