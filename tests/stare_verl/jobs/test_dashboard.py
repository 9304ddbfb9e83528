"""``stare-verl plot``: a run's dashboard from a bare verl file-logger JSONL or a run folder; titles of the run
plots; the tool statistics that reach metrics.jsonl."""

import json

import pytest

from stare_verl.jobs import dashboard as dash
from stare_verl.jobs.cli import main
from stare_verl.jobs.runlog import plot_run, read_verl_jsonl, select_metrics, write_metrics_jsonl

ALL_PANELS = [dash.PANEL_ENTROPY, dash.PANEL_REWARD, dash.PANEL_LENGTH, dash.PANEL_TOOLS, dash.PANEL_COV]
PNG = b"\x89PNG\r\n\x1a\n"


def _step(s: int, tools: bool = True) -> dict:
    data = {
        "actor/entropy": 0.5 - 0.05 * s,
        "stare/batch_entropy": 0.45 - 0.05 * s,
        "stare/target_entropy": 0.3,
        "stare/gate_on": float(s >= 3),
        "stare/w": 1.1,
        "stare/m": 0.9,
        "critic/score/mean": 0.1 * s,
        "reward/acc/mean": 0.1 * s,
        "response_length/mean": 100.0 + s,
        "response_length/max": 200.0,
        "entropy_control/cov_logp_adv": 0.02,
        "entropy_control/cov_logp_adv_eff": 0.02 if s < 3 else -0.01,
        "perf/mfu": 0.3,
        "note": "a string verl may log",
    }
    if tools:
        data |= {"reward/num_tool_calls/mean": 1.5, "reward/num_tool_executed/mean": 1.0,
                 "reward/num_tool_errors/mean": 0.5}  # fmt: skip
    return {"step": s, "data": data}


def _write_verl(path, steps, tools=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(_step(s, tools)) for s in steps) + "\nnot json\n")
    return path


def _capture_figures(monkeypatch):
    """Titles and legend texts of every figure saved (matplotlib.Figure.savefig patched)."""
    import matplotlib.pyplot as plt

    seen = []
    real = plt.Figure.savefig

    def savefig(fig, *args, **kwargs):
        seen.append({
            "suptitle": fig._suptitle.get_text() if fig._suptitle else "",
            "titles": [ax.get_title() for ax in fig.axes],
            "legend": [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()],
            "texts": [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts],
        })  # fmt: skip
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    return seen


def test_plot_a_bare_verl_jsonl(tmp_path, capsys, monkeypatch):
    seen = _capture_figures(monkeypatch)
    path = _write_verl(tmp_path / "exp" / "verl_metrics.jsonl", (1, 2, 3, 4))
    assert main(["plot", str(path)]) == 0
    out = tmp_path / "exp" / "plots" / "dashboard.png"  # plots/ next to a bare file
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 30_000
    (fig,) = seen
    assert fig["suptitle"] == (
        "method not recorded, verl_metrics.jsonl, steps 1-4\ntarget H 0.3 nats; W 1.1, M 0.9"
    )
    assert fig["titles"][:4] == ALL_PANELS[:4] and fig["titles"][4].startswith(dash.PANEL_COV)
    assert "gate on (entropy < target)" in fig["legend"] and "target 0.3" in fig["legend"]
    assert {"tool calls", "executed"} <= set(fig["legend"])
    assert "dH ~ -eta * Cov" in fig["texts"][-1].replace("\n", " ")
    assert not any("held-out" in t for t in fig["legend"])  # no evaluation known for a bare file

    d = dash.plot_path(path, tmp_path / "elsewhere")
    assert d.path == tmp_path / "elsewhere" / "dashboard.png" and d.path.is_file()
    assert d.panels == ALL_PANELS and d.not_logged == [] and d.skipped == []


def test_plot_a_run_folder_names_method_seed_settings_and_evaluations(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _write_verl(run / "logs" / "verl_metrics.20260101-000000.jsonl", (1, 2), tools=False)
    _write_verl(run / "logs" / "verl_metrics.20260102-000000.jsonl", (3,), tools=False)  # a resumed part
    ev = {"T=0": {"accuracy": 0.1}, "T=1": {"accuracy": 0.05}}
    (run / "summary.json").write_text(json.dumps({
        "family": "shortcot", "method": "stare", "seed": 3, "eval_before": ev,
        "eval_after": {"T=0": {"accuracy": 0.4}, "T=1": {"accuracy": 0.25}},
    }))  # fmt: skip
    hydra = run / "logs" / "hydra" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(
        "algorithm:\n  adv_estimator: stare\n  stare:\n    variant: O1\n    top_p_ratio: 0.02\n    reweight_w: 3.0\n"
        "    reweight_m: 0.9\n    target_entropy: 0.3\n    epsilon: 1e-06\n"
    )
    seen = _capture_figures(monkeypatch)
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "plots" / "dashboard.png")
    (fig,) = seen
    # YAML keeps 1e-06 a string: read as the method reads it, it is the default and left out
    assert fig["suptitle"] == (
        "stare, seed 3, shortcot, steps 1-3\ntop_p_ratio=0.02, reweight_w=3, others at defaults; target H 0.3 nats"
    )
    assert "held-out greedy (0.100 -> 0.400)" in fig["legend"] and "held-out T = 1 (0.050 -> 0.250)" in fig["legend"]
    assert dash.PANEL_TOOLS not in fig["titles"]  # no tool metric: the panel is left out
    d = dash.plot_path(run)
    assert d.skipped == [dash.PANEL_TOOLS] and d.panels == [p for p in ALL_PANELS if p != dash.PANEL_TOOLS]


def test_a_runs_metrics_jsonl_and_an_unfinished_run(tmp_path, monkeypatch):
    """Our metrics.jsonl (flat rows) plots too; a run without summary.json still shows its evaluation files."""
    run = tmp_path / "run"
    rows = read_verl_jsonl([_write_verl(tmp_path / "part.jsonl", (1, 2, 3))])
    write_metrics_jsonl(rows, run / "metrics.jsonl")
    (run / "eval_before.json").write_text(json.dumps({"T=0": {"accuracy": 0.2}}))
    seen = _capture_figures(monkeypatch)
    d = dash.plot_path(run / "metrics.jsonl")
    assert d.path == run / "plots" / "dashboard.png" and d.panels == ALL_PANELS
    assert "held-out greedy (0.200 -> -)" in seen[0]["legend"]
    assert d.title.startswith("method not recorded, metrics.jsonl, steps 1-3")


def test_missing_panels_say_not_logged(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"actor/entropy": 0.2}}) + "\n")
    d = dash.plot_path(path)
    assert d.panels == [dash.PANEL_ENTROPY]
    assert d.not_logged == [dash.PANEL_REWARD, dash.PANEL_LENGTH, dash.PANEL_COV] and d.skipped == [dash.PANEL_TOOLS]
    assert d.path.read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nope", "error: no such file or folder: "),
        (lambda p: p, "holds no metrics (no logs/verl_metrics.*.jsonl or metrics.jsonl"),
        (lambda p: (p / "x.jsonl").write_text('{"a": 1}\n[1, 2]\n') and p / "x.jsonl", "holds no metrics"),
        (lambda p: (p / "s.jsonl").write_text('{"step": 1, "data": {"x": "text"}}\n') and p / "s.jsonl",
         "holds no metrics"),
        (lambda p: (p / "b.bin").write_bytes(b"\xff\xfe\x00") and p / "b.bin", "holds no metrics"),
    ],
)  # fmt: skip
def test_bad_paths_exit_2_with_one_line(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert main(["plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "plots").exists()


def test_draw_dashboard_without_metrics_raises(tmp_path):
    with pytest.raises(dash.NoMetricsError):
        dash.draw_dashboard([{"step": 1}], tmp_path / "d.png")


def test_run_plots_are_titled_by_the_run_not_by_metric_keys(tmp_path, monkeypatch):
    seen = _capture_figures(monkeypatch)
    rows = read_verl_jsonl([_write_verl(tmp_path / "p.jsonl", (1, 2))])
    summary = {"method": "entropy_bonus:coef=0.01", "seed": 2, "family": "tooluse"}
    title = dash.run_title(rows, summary, {"coef": 0.01})
    assert title == "entropy_bonus, seed 2, tooluse, steps 1-2\ncoef=0.01; target H 0.3 nats"
    plot_run(rows, tmp_path / "plots", title=title)
    titles = [t for fig in seen for t in fig["titles"] if t]
    assert titles and all(t.endswith(title) for t in titles)
    assert {t.split("\n")[0] for t in titles} >= {"Policy entropy", "Reward", "Response length"}
    seen.clear()
    plot_run(rows, tmp_path / "untitled")
    assert not any("/" in t for fig in seen for t in fig["titles"])  # no raw metric key such as critic/score/mean


def test_tool_statistics_reach_the_step_metrics_and_metrics_jsonl(tmp_path):
    """The tool-use reward's per-episode statistics (TOOL_STAT_KEYS) become per-step reward/<key>/mean metrics
    (the trainer's reward_extra_means_of), metrics.jsonl keeps them, and the dashboard reads those names."""
    from envs.tool_use.task import TOOL_STAT_KEYS
    from stare_verl.trainer import reward_extra_means_of

    infos = [
        {**TOOL_STAT_KEYS, "num_tool_calls": 2, "num_tool_errors": 1, "tool_time_s": 0.5, "acc": True,
         "score": 1.0, "pred": "12", "verify_method": "exact"},
        {**TOOL_STAT_KEYS, "num_tool_calls": 1, "num_tool_errors": 0, "acc": False, "score": 0.0, "pred": ""},
        "not a dict",
    ]  # fmt: skip
    means = reward_extra_means_of(infos)
    assert set(means) == {f"reward/{k}/mean" for k in TOOL_STAT_KEYS} | {"reward/acc/mean"}  # no score, no str
    assert means["reward/num_tool_calls/mean"] == 1.5 and means["reward/num_tool_errors/mean"] == 0.5
    assert means["reward/tool_time_s/mean"] == 0.25 and means["reward/acc/mean"] == 0.5
    assert {k for k, _ in dash.TOOL_METRICS} <= set(means)
    kept = select_metrics({"step": 1, **means, "perf/mfu": 0.1})
    assert {k: v for k, v in kept.items() if k != "step"} == means
    out = write_metrics_jsonl([{"step": 1, **means}], tmp_path / "metrics.jsonl")
    assert json.loads(out.read_text())["reward/num_tool_errors/mean"] == 0.5


def test_a_method_target_that_follows_stares_is_shown_resolved(tmp_path):
    """REPO-R's and the adaptive coefficient's target follows the recipe's STARE target by interpolation; the title
    showed ``target_entropy=${algorithm.stare.target_entropy}`` (a fresh user's find), now the value."""
    from stare_verl.jobs.dashboard import method_settings
    from stare_verl.jobs.runlog import RunFolder

    hydra = tmp_path / "run" / "logs" / "hydra" / ".hydra"
    hydra.mkdir(parents=True)
    for name in ("repo_r", "adaptive_entropy"):
        (hydra / "config.yaml").write_text(
            "algorithm:\n  stare:\n    target_entropy: 0.11\n"
            f"  {name}:\n    target_entropy: ${{algorithm.stare.target_entropy}}\n"
        )
        settings = method_settings(RunFolder(tmp_path / "run"), {"method": name})
        assert settings["target_entropy"] == 0.11, name
