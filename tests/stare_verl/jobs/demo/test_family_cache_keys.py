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
