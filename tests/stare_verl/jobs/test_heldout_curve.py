"""The held-out entropy curve (issue 30): a tiny CPU run saves about six checkpoints, the train job reads the
held-out entropy of each, and the report, the run's plots and ``make compare``'s overlay draw it, so a hold (or a
drift) shows without the batches' swing."""

import json

import pytest

import stare_verl.jobs.demo.evaluate as ev
from stare_verl.jobs import compare, train
from stare_verl.jobs import dashboard as dash
from stare_verl.jobs.backend import RunBackend
from stare_verl.jobs.runlog import (
    HELDOUT_CURVE_LABEL,
    RunFolder,
    entropy_report,
    format_entropy_report,
    heldout_curve,
    hf_checkpoints,
    plot_run,
)

PROBE = {"nll": 0.03, "episodes": 200, "tokens": 7458}


def _probe(h: float) -> dict:
    return {"entropy": h, **PROBE}


def _hf(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w")


def _checkpoints(root, steps, latest, no_weights=()):
    for s in steps:
        d = root / f"global_step_{s}" / "actor" / "huggingface"
        if s in no_weights:
            d.mkdir(parents=True)
        else:
            _hf(d)
    (root / "latest_checkpointed_iteration.txt").write_text(str(latest))


def test_every_checkpoint_with_weights_up_to_the_latest(tmp_path):
    root = tmp_path / "checkpoints"
    _checkpoints(root, [5, 10, 15, 20, 25], latest=20, no_weights=(15,))
    for odd in ("global_step_x", "global_step_05", "global_step_\u00b2", "global_step_\u0663", "global_step_"):
        _hf(root / odd / "actor" / "huggingface")  # not verl's names: never steps (05 would be 5 twice)
    got = hf_checkpoints(root)
    assert [s for s, _ in got] == [5, 10, 20]  # 15 holds no weights, 25 is past the tracker
    assert got[0][1] == root / "global_step_5" / "actor" / "huggingface"
    assert RunFolder(tmp_path).hf_checkpoints() == got
    assert hf_checkpoints(tmp_path / "none") == []
    (root / "latest_checkpointed_iteration.txt").write_text("garbage")
    assert hf_checkpoints(root) == []


@pytest.mark.parametrize(("steps", "freq", "n_saved"), [(30, 5, 6), (1, 5, 1), (3, 5, 1), (7, 5, 2), (12, 5, 3),
                                                      (100, 17, 6), (1000, 167, 6)])  # fmt: skip
def test_a_tiny_run_saves_up_to_six_checkpoints_at_least_five_steps_apart(steps, freq, n_saved):
    assert train.heldout_save_freq(steps) == freq
    saved = {s for s in range(1, steps + 1) if s % freq == 0} | {steps}  # verl also saves the last step
    assert len(saved) == n_saved <= train.HELDOUT_POINTS + 1


def test_the_save_freq_reaches_the_tiny_recipe_and_an_explicit_one_wins(tmp_path):
    from stare_verl.jobs.train.cpu import TinyLaunch

    run = RunFolder(tmp_path / "run")
    data = {"train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet"}
    backend = RunBackend("cpu", "hf", "cpu", "cpu", "bwrap")

    def command(argv, from_model=False):
        job = TinyLaunch(train.parse_options(argv), backend, run, "tooluse_tiny", [], "t")
        return train.tiny_recipe_command(job, tmp_path, data, from_model=from_model)

    assert "trainer.save_freq=5" in command(["--family", "tooluse", "--steps", "30"])
    assert "trainer.save_freq=3" in command(["--family", "tooluse", "--steps", "30", "--save-freq", "3"])
    # a user's MODEL (from_model): one checkpoint at the end, as before
    assert "trainer.save_freq=30" in command(["--family", "tooluse", "--steps", "30"], from_model=True)


def test_train_reads_every_checkpoint_and_the_last_is_after(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ev, "heldout_episodes", lambda path, n: [([1, 2, 3], [0, 1, 1])] * n)
    values = {"sft": 0.050, "s5": 0.048, "s10": 0.045, "s15": 0.041}
    read = []

    def entropy(path, eps):
        read.append(path.name)
        return _probe(values[path.name])

    monkeypatch.setattr(ev, "heldout_entropy", entropy)
    sft = tmp_path / "sft"
    sft.mkdir()
    ckpts = [(5, tmp_path / "s5"), (10, tmp_path / "s10"), (15, tmp_path / "s15")]
    got = train.heldout_entropy_curve(sft, ckpts, 3, "t")
    assert read == ["sft", "s5", "s10", "s15"]
    assert [(e["step"], e["entropy"]) for e in got["by_step"]] == [(0, 0.05), (5, 0.048), (10, 0.045), (15, 0.041)]
    assert got["before"] == _probe(0.05) and got["after"] == _probe(0.041)
    assert train.heldout_entropy_curve(sft, [], 3, "t") is None  # nothing to read: a warning, not a crash
    assert "no held-out entropy (ValueError: no RL checkpoint with weights)" in capsys.readouterr().err

    bad = {"s10"}

    def damaged(path, eps):
        if path.name in bad:
            raise OSError("truncated safetensors")
        return _probe(values[path.name])

    monkeypatch.setattr(ev, "heldout_entropy", damaged)
    got = train.heldout_entropy_curve(sft, ckpts, 3, "t")  # an earlier checkpoint that cannot be read: left out
    assert [e["step"] for e in got["by_step"]] == [0, 5, 15] and got["after"] == _probe(0.041)
    err = capsys.readouterr().err
    assert "held-out entropy of step 10 left out" in err and "OSError: truncated safetensors" in err
    assert "delete" not in err  # the cache is not at fault
    bad = {"s15"}  # the last one: no "after", no probe
    assert train.heldout_entropy_curve(sft, ckpts, 3, "t") is None
    err = capsys.readouterr().err
    assert "the last checkpoint" in err and "heldout_entropy_n3.json" in err


def _rows(n=30):
    return [{"step": i + 1, "stare/batch_entropy": 0.05, "stare/target_entropy": 0.053, "stare/gate_on": 1.0,
             "stare/w": 8.0, "stare/m": 1.0, "stare/frac_l_plus": 0.02, "stare/frac_l_minus": 0.0,
             "stare/mean_weight": 1.1} for i in range(n)]  # fmt: skip


def test_the_report_keeps_the_curve_and_prints_it_as_ratios():
    by_step = [{"step": 0, **_probe(0.05)}, {"step": 10, **_probe(0.048)}, {"step": 5, **_probe(0.049)},
               {"step": 30, **_probe(0.047)},
               {"step": "20", **_probe(0.01)}, {"step": True, **_probe(0.01)}, {"step": 25, "entropy": 0.01},
               {"step": -5, **_probe(0.01)}, "junk"]  # fmt: skip
    rep = entropy_report(_rows(), heldout={"before": _probe(0.05), "after": _probe(0.047), "by_step": by_step})
    curve = rep["heldout_entropy"]["by_step"]
    assert [(e["step"], e["entropy"]) for e in curve] == [(0, 0.05), (5, 0.049), (10, 0.048), (30, 0.047)]
    assert [e["ratio"] for e in curve] == pytest.approx([1.0, 0.98, 0.96, 0.94])
    lines = format_entropy_report(rep)
    assert "held-out entropy by step (x the SFT's): 0 1.00, 5 0.98, 10 0.96, 30 0.94" in lines
    assert heldout_curve(rep["heldout_entropy"]) == ([0, 5, 10, 30], [0.05, 0.049, 0.048, 0.047])
    # before and after only (a run from before the curve, or --save-freq = steps): no curve line
    rep = entropy_report(_rows(), heldout={"before": _probe(0.05), "after": _probe(0.047)})
    assert rep["heldout_entropy"]["by_step"] == []
    assert not any(x.startswith("held-out entropy by step") for x in format_entropy_report(rep))
    for bad in (None, {}, {"by_step": "x"}, {"by_step": [{"step": 1, "entropy": float("nan")}]}, [1],
                {"by_step": [{"step": True, "entropy": 0.05}, {"step": -3, "entropy": 0.05},
                             {"step": 1, "entropy": True}, {"step": 1, "entropy": 10**400},
                             {"step": 10**400, "entropy": 0.05}, {"step": 2.0, "entropy": 0.05}]}):  # fmt: skip
        assert heldout_curve(bad) == ([], [])
    # a hand-edited list: sorted, one point per step (the last entry of a step)
    edited = {"by_step": [{"step": 10, "entropy": 0.04}, {"step": 0, "entropy": 0.05}, {"step": 10, "entropy": 0.045}]}
    assert heldout_curve(edited) == ([0, 10], [0.05, 0.045])
    # the report's own by_step reads back (it keeps the probe's numbers)
    h = entropy_report(_rows(), heldout={"before": _probe(0.05), "after": _probe(0.047), "by_step": by_step})
    again = entropy_report(_rows(), heldout=h["heldout_entropy"])["heldout_entropy"]
    assert again["by_step"] == h["heldout_entropy"]["by_step"]
    huge = entropy_report(_rows(), heldout={"before": _probe(10**400), "after": _probe(0.047)})
    assert huge["heldout_entropy"] is None and format_entropy_report(huge)  # no number beyond a float


def _lines_saved(monkeypatch):
    """For every figure saved: {label: (xdata, ydata)} of its labelled lines."""
    import matplotlib.pyplot as plt

    seen = []
    real = plt.Figure.savefig

    def savefig(fig, *args, **kwargs):
        seen.append({ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
                     for ax in fig.axes for ln in ax.get_lines()})  # fmt: skip
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    return seen


def test_the_run_plots_draw_the_curve(tmp_path, monkeypatch):
    seen = _lines_saved(monkeypatch)
    heldout = entropy_report(_rows(), heldout={"before": _probe(0.05), "after": _probe(0.047), "by_step": [
        {"step": 0, **_probe(0.05)}, {"step": 15, **_probe(0.049)}, {"step": 30, **_probe(0.047)}]})
    summary = {"method": "stare", "seed": 0, "family": "tooluse", "entropy_report": heldout}
    plot_run(_rows(), tmp_path, heldout=heldout["heldout_entropy"])
    dash.draw_dashboard(_rows(), tmp_path / "dashboard.png", summary)
    entropy_png, dashboard_png = seen[0], seen[-1]
    for fig in (entropy_png, dashboard_png):
        assert fig[HELDOUT_CURVE_LABEL] == ([0, 15, 30], [0.05, 0.049, 0.047])
    seen.clear()
    plot_run(_rows(), tmp_path)  # no probe: no curve
    dash.draw_dashboard(_rows(), tmp_path / "dashboard.png", {"entropy_report": {"heldout_entropy": None}})
    assert all(HELDOUT_CURVE_LABEL not in fig for fig in seen)


def _finished_run(root, name, method, curve):
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "actor/entropy": 0.04, "stare/target_entropy": 0.053}) for s in (1, 2)) + "\n")
    by_step = [{"step": s, **_probe(h)} for s, h in curve]
    report = entropy_report([], heldout={"before": by_step[0], "after": by_step[-1], "by_step": by_step})
    (run / "summary.json").write_text(json.dumps({"method": method, "seed": 0, "eval_after": {}, "eval_before": {},
                                                  "entropy_report": report}))  # fmt: skip
    return run


def test_compare_overlays_each_methods_curve(tmp_path, monkeypatch):
    seen = _lines_saved(monkeypatch)
    stats = [
        compare.run_stats(_finished_run(tmp_path, "grpo-seed0", "grpo", [(0, 0.05), (15, 0.045), (30, 0.040)])),
        compare.run_stats(_finished_run(tmp_path, "grpo-seed1", "grpo", [(0, 0.05), (15, 0.047), (30, 0.044)])),
        compare.run_stats(_finished_run(tmp_path, "stare-seed0", "stare", [(0, 0.05), (15, 0.05), (30, 0.049)])),
    ]
    assert stats[0]["heldout_curve"] == [[0, 0.05], [15, 0.045], [30, 0.04]]
    out = tmp_path / "cmp"
    compare.write_report(stats, out)
    assert (out / "heldout_entropy_overlay.png").read_bytes().startswith(b"\x89PNG")
    # a statistic these runs do not have (no gate logged) is JSON's null and the table's "-", never NaN
    assert any(isinstance(v, float) and v != v for s in stats for v in s.values())
    table = json.loads((out / "table.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in table.json"))
    assert any(v is None for row in table for v in row.values()) and "nan" not in (out / "table.md").read_text()
    overlay = next(fig for fig in seen if "grpo (mean of 2)" in fig and any(
        x == [0, 15, 30] and y[0] == 0.05 for x, y in fig.values()) and fig["grpo (mean of 2)"][1][0] == 0.05)
    assert overlay["grpo (mean of 2)"][1] == pytest.approx([0.05, 0.046, 0.042])
    assert overlay["stare (mean of 1)"][1] == pytest.approx([0.05, 0.05, 0.049])
    # runs without a curve (before / after only): no overlay, and none left from an earlier comparison in the folder
    plain = [dict(s, heldout_curve=[[0, 0.05], [30, 0.04]]) for s in stats]
    compare.write_report(plain, out)
    assert not (out / "heldout_entropy_overlay.png").exists()


def test_compare_reads_old_and_damaged_summaries(tmp_path):
    """A run from before the curve gives two points (its SFT value at step 0, after RL at its last step); a
    summary whose report is not the report's shape reads as not measured, not as a crash."""
    old = _finished_run(tmp_path, "grpo-seed0", "grpo", [(0, 0.05), (2, 0.04)])
    summary = json.loads((old / "summary.json").read_text())
    summary["entropy_report"]["heldout_entropy"]["by_step"] = []
    (old / "summary.json").write_text(json.dumps(summary))
    assert compare.run_stats(old)["heldout_curve"] == [[0, 0.05], [2, 0.04]]  # metrics.jsonl has 2 steps
    for damaged in ([1], "x", {"heldout_entropy": [1]}, {"heldout_entropy": "x"},
                    {"heldout_entropy": {"before": 1, "after": [2], "ratio": 0.9}}, None):  # fmt: skip
        summary["entropy_report"] = damaged
        (old / "summary.json").write_text(json.dumps(summary))
        st = compare.run_stats(old)
        assert st["heldout_curve"] == [] and st["heldout_entropy_after"] is None
