"""The cold-start SFT cache key of every family stays what it was before the family descriptors (issue 28): an
existing checkpoint ``runs/cache/sft-<hash>`` must still be found (tool use's defaults changed in issue 30: its old
keys are pinned with the old settings given explicitly).

``config_hash`` hashes ``key_config(cfg)`` = ``{"config": ..., "versions": ...}``; the versions are the installed
libraries', so the pins below are of the ``config`` part (recorded at 57bfe42, before the move).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from stare_verl.jobs.demo.sft import SFTConfig, config_hash, key_config

# Tool use before issue 30 (one digit a token, vocabulary 384, 1000 constant-lr steps): the same settings given
# explicitly still find the old checkpoints; its defaults since then have keys of their own.
OLD_TOOLUSE = {"vocab_size": 384, "digits_per_token": 1, "steps": 1000, "anneal_below_loss": None}
PINNED = [
    ("tooluse", OLD_TOOLUSE, "5249c16b6d03a61c"),
    ("tooluse", {**OLD_TOOLUSE, "stop_accuracy": 0.6, "steps": 1500}, "d392d1297e9f4df2"),
    ("tooluse", {**OLD_TOOLUSE, "decay_steps": 100}, "e76a8be26c9f73c1"),
    ("tooluse", {}, "3d0a5b8c049a3736"),
    ("tooluse", {"stop_accuracy": 0.6, "steps": 1500}, "0b645d822c91539d"),
    ("tooluse", {"decay_steps": 100, "anneal_below_loss": None}, "49f02ae5afed6025"),
    ("shortcot", {}, "2cb8bea5683b182b"),
    ("shortcot", {"stop_accuracy": 0.6, "steps": 1500}, "cd4e1e9a133324b0"),
    ("shortcot", {"decay_steps": 100}, "8c16204592a07983"),
    ("longcot", {}, "a1f3a9bf7e94808f"),
    ("longcot", {"stop_accuracy": 0.6, "steps": 1500}, "d91e38fe3a5b49ee"),
    ("longcot", {"decay_steps": 100}, "7e8e4baaf600377c"),
]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("family", "kw", "pinned"), PINNED)
def test_cache_key_config_is_unchanged(family, kw, pinned):
    key = key_config(SFTConfig(family=family, **kw))
    assert sorted(key) == ["config", "versions"]
    assert sorted(key["versions"]) == ["format", "reasoning_gym", "tokenizers", "torch", "transformers"]
    assert key["versions"]["format"] == "1"
    assert _digest(key["config"]) == pinned
    assert config_hash(SFTConfig(family=family, **kw)) == _digest(key)


def test_tool_use_key_has_no_family_and_cot_keys_count_their_demos():
    assert "family" not in key_config(SFTConfig(family="tooluse"))["config"]
    for fam in ("shortcot", "longcot"):
        conf = key_config(SFTConfig(family=fam))["config"]
        assert conf["family"] == fam and conf["demos_per_problem"] == 4


# The whole key config of the default SFTConfig() (tool use) and more pins, recorded at 5e240f0, before SFTConfig's
# fields got their descriptions and the module was split: the split and the descriptions change no key.
DEFAULT_KEY_CONFIG = {
    "anneal_below_loss": 0.1, "anneal_final_lr_ratio": 0.15, "anneal_steps": 300, "batch_size": 32, "data_seed": 0,
    "digits_per_token": 2, "init_seed": 0, "lr": 0.002, "max_grad_norm": 1.0, "max_response_tokens": 128,
    "model": {"hidden_size": 128, "intermediate_size": 384, "max_position_embeddings": 1024, "num_attention_heads": 4,
              "num_hidden_layers": 2, "num_key_value_heads": 2, "rope_theta": 10000.0, "tie_word_embeddings": True},
    "n_heldout": 200, "n_train": 4096, "steps": 1300, "train_seed": 0, "vocab_size": 484, "warmup_steps": 20,
    "weight_decay": 0.01,
}  # fmt: skip
MORE_PINNED = [
    ("tooluse", {"code_styles": 3}, "ffa397607464a0d4"),
    ("tooluse", {"anneal_below_loss": 0.2, "anneal_steps": 100, "anneal_final_lr_ratio": 0.3}, "e65dae69c010ef2f"),
    ("tooluse", {"digits_per_token": 1, "vocab_size": 384}, "915f4569e7b00cf5"),
    ("shortcot", {"anneal_below_loss": 0.2}, "71d3e4d02ba571b7"),
    ("longcot", {"data_seed": 3, "init_seed": 4, "train_seed": 5, "n_train": 512}, "0c7aed0dae767e9b"),
    # the run-only fields leave the key as it is: shortcot's default pin
    ("shortcot", {"eval_every": 10, "num_threads": 2, "progress": False, "cache_dir": "/x", "eval_temperatures": (0.0,)},
     "2cb8bea5683b182b"),
]  # fmt: skip


def test_default_config_key_is_the_recorded_one():
    key = key_config(SFTConfig())
    assert key["config"] == DEFAULT_KEY_CONFIG
    assert _digest(key["config"]) == "3d0a5b8c049a3736"  # PINNED's ("tooluse", {})
    assert config_hash(SFTConfig()) == _digest({"config": DEFAULT_KEY_CONFIG, "versions": key["versions"]})


@pytest.mark.parametrize(("family", "kw", "pinned"), MORE_PINNED)
def test_more_cache_keys_are_unchanged(family, kw, pinned):
    assert _digest(key_config(SFTConfig(family=family, **kw))["config"]) == pinned


def test_every_field_has_a_description_and_the_cli_help_shows_it(capsys):
    from stare_verl.jobs.demo import sft

    fields = SFTConfig.model_fields
    assert len(fields) == 30
    missing = [name for name, info in fields.items() if not (info.description or "").strip()]
    assert missing == []
    assert all(len(info.description) >= 20 for info in fields.values())  # a sentence, not a placeholder
    with pytest.raises(SystemExit):
        sft.main(["--help"])
    flat = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    assert "demonstrations per optimizer step; default 32" in flat
    assert "default 1000 (tooluse 1300, shortcot 1000, longcot 800)" in flat  # the families' own steps
