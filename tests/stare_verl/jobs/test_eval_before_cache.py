"""The run's cached held-out evaluation before RL (``eval_before.json``) is reused only under the settings it was
computed with: another --eval-samples, --n-eval, --max-turns (where episodes have turns) or SFT checkpoint
evaluates again. The SFT, the evaluation and RL are stand-ins; the recipe is composed and checked for real."""

from __future__ import annotations

import json

import pytest

import stare_verl.jobs.train as T
from stare_verl.jobs.demo import sft as demo_sft


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    calls = []
    state = {"sft": tmp_path / "sft-a"}

    def evaluate_sft(sft_dir, sft_cfg, n, max_turns, samples):
        calls.append((sft_dir.name, n, max_turns, samples))
        return {"T=0": {"accuracy": 0.5, "n": n}, "T=1": {"accuracy": 0.25, "n": n * samples,
                                                          "samples_per_problem": samples}}  # fmt: skip

    monkeypatch.setattr(demo_sft, "ensure_sft_checkpoint", lambda cfg: state["sft"])
    monkeypatch.setattr(demo_sft, "read_report", lambda d: {"heldout": {"T=0.0": {"accuracy": 1.0}}})
    monkeypatch.setattr(T.cpu, "evaluate_sft_cached", evaluate_sft)
    monkeypatch.setattr(T.cpu, "train_tiny_recipe", lambda *a, **k: 0)
    monkeypatch.chdir(tmp_path)
    return calls, state, tmp_path


def _run(tmp_path, family, *opts):
    assert T.main(["--cpu", "--family", family, "--steps", "2", "--run-dir", str(tmp_path / "run"), *opts]) == 0


@pytest.mark.parametrize(("family", "change", "again"), [
    ("shortcot", ["--eval-samples", "4"], True),
    ("shortcot", ["--n-eval", "7"], True),
    ("tooluse", ["--max-turns", "5"], True),  # tool-use episodes have turns
    ("shortcot", ["--max-turns", "5"], False),  # one-turn episodes: the same evaluation
    ("shortcot", [], False),  # the same settings: reused
    ("shortcot", ["sft-b"], True),  # another SFT checkpoint
])  # fmt: skip
def test_eval_before_is_reused_only_under_its_settings(stubbed, family, change, again):
    calls, state, tmp_path = stubbed
    _run(tmp_path, family, "--n-eval", "5", "--eval-samples", "2")
    assert len(calls) == 1
    before = json.loads((tmp_path / "run" / "eval_before.json").read_text())
    opts = {"--n-eval": "5", "--eval-samples": "2"}
    if change == ["sft-b"]:
        state["sft"] = tmp_path / "sft-b"
    elif change:
        opts[change[0]] = change[1]
    _run(tmp_path, family, *[x for kv in opts.items() for x in kv])
    assert len(calls) == (2 if again else 1)
    after = json.loads((tmp_path / "run" / "eval_before.json").read_text())
    if again:
        name, n, turns, k = calls[-1]
        assert (name, n, k) == (state["sft"].name, int(opts["--n-eval"]), int(opts["--eval-samples"]))
        assert turns == int(opts.get("--max-turns", calls[0][2]))
        assert after["T=1"]["n"] == int(opts["--n-eval"]) * int(opts["--eval-samples"])
    else:
        assert after == before


def test_an_eval_before_without_its_key_is_evaluated_again(stubbed):
    calls, _, tmp_path = stubbed
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_before.json").write_text(json.dumps({"T=0": {"accuracy": 0.9, "n": 200}}))  # an earlier version's
    _run(tmp_path, "shortcot", "--n-eval", "5", "--eval-samples", "2")
    assert len(calls) == 1 and json.loads((run / "eval_before.json").read_text())["T=0"]["n"] == 5
    (run / "eval_before.key.json").write_text("{torn")
    _run(tmp_path, "shortcot", "--n-eval", "5", "--eval-samples", "2")
    assert len(calls) == 2
