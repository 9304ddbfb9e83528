"""The evaluation before RL reuses the SFT's own held-out evaluation when it is the same one (``stare_verl.jobs.train.heldout``)."""

import json

import pytest

from stare_verl.jobs.demo.sft import SFTConfig
from stare_verl.jobs.train.heldout import evaluate_sft_cached, sft_report_eval


def _report(tmp_path, n=200, temps=("T=0.0", "T=1.0"), spp=1):
    heldout = {t: {"n": n, "accuracy": 0.6 + 0.1 * i, "samples_per_problem": spp} for i, t in enumerate(temps)}
    (tmp_path / "sft_report.json").write_text(json.dumps({"heldout": heldout}))
    return heldout


def test_same_evaluation_is_reused(tmp_path):
    heldout = _report(tmp_path)
    cfg = SFTConfig(family="tooluse")
    assert sft_report_eval(tmp_path, cfg, 200, 3, 1) == {"T=0": heldout["T=0.0"], "T=1": heldout["T=1.0"]}
    # CoT families have one turn whatever --max-turns says
    assert sft_report_eval(tmp_path, SFTConfig(family="shortcot"), 200, 5, 1) is not None


@pytest.mark.parametrize(
    "n, turns, samples, report_kw",
    [
        (8, 3, 1, {}),  # fewer problems than the SFT evaluated
        (200, 2, 1, {}),  # other tool-use turns
        (200, 3, 4, {}),  # avg@4: several samples per problem
        (200, 3, 1, {"temps": ("T=0.0", "T=0.7")}),  # other temperatures
        (200, 3, 1, {"n": 100}),  # a report over other problems
    ],
)
def test_a_different_evaluation_is_not_reused(tmp_path, n, turns, samples, report_kw):
    _report(tmp_path, **report_kw)
    assert sft_report_eval(tmp_path, SFTConfig(family="tooluse"), n, turns, samples) is None


@pytest.mark.parametrize(
    "content",
    [
        "", "{not json", "[]", '{"heldout": 3}', '{"heldout": []}', "[" * 100000 + "]" * 100000,
        # an entry that is no evaluation: not a dict, no or a non-numeric accuracy, a count that is no int
        '{"heldout": {"T=0.0": [], "T=1.0": {"n": 200, "accuracy": 0.6}}}',
        '{"heldout": {"T=0.0": {"n": 200, "accuracy": 0.9}, "T=1.0": null}}',
        '{"heldout": {"T=0.0": {"n": 200}, "T=1.0": {"n": 200}}}',
        '{"heldout": {"T=0.0": {"n": 200, "accuracy": 0.9}, "T=1.0": {"n": 200, "accuracy": "high"}}}',
        '{"heldout": {"T=0.0": {"n": 200, "accuracy": 0.9}, "T=1.0": {"n": 200, "accuracy": true}}}',
        '{"heldout": {"T=0.0": {"n": 200, "accuracy": 0.9}, "T=1.0": {"n": 200, "accuracy": 1.5}}}',
        '{"heldout": {"T=0.0": {"n": 200, "accuracy": 0.9}, "T=1.0": {"n": 200.0, "accuracy": 0.5}}}',
    ],
)
def test_a_missing_or_broken_report_is_not_reused(tmp_path, content):
    cfg = SFTConfig(family="tooluse")
    assert sft_report_eval(tmp_path, cfg, 200, 3, 1) is None  # no report at all
    (tmp_path / "sft_report.json").write_text(content)
    assert sft_report_eval(tmp_path, cfg, 200, 3, 1) is None


def test_the_reused_evaluation_is_cached_like_a_computed_one(tmp_path, monkeypatch):
    heldout = _report(tmp_path)
    monkeypatch.setattr("stare_verl.jobs.train.heldout.evaluate_heldout", lambda *a, **k: pytest.fail("evaluated again"))
    ev = evaluate_sft_cached(tmp_path, SFTConfig(family="tooluse"), 200, 3)
    assert ev["T=1"] == heldout["T=1.0"]
    assert json.loads((tmp_path / "eval_n200_turns3.json").read_text()) == ev


def test_the_cli_default_turns_are_the_evaluations_default():
    from stare_verl.jobs.demo.evaluate import DEFAULT_MAX_ASSISTANT_TURNS
    from stare_verl.jobs.train import parse_options

    assert parse_options(["--cpu"]).max_turns == DEFAULT_MAX_ASSISTANT_TURNS


@pytest.mark.parametrize("field", ["lr", "weight_decay", "max_grad_norm"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_optimizer_settings_are_rejected(field, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field):
        SFTConfig(**{field: value})
    assert SFTConfig().lr == 2e-3  # the defaults still validate
