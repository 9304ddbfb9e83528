"""metrics.jsonl from verl's file logger, and run plots."""

import json

from stare_verl.jobs.runlog import plot_run, read_verl_jsonl, select_metrics, write_metrics_jsonl


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json\n")


def test_parts_merge_with_resume_and_selection(tmp_path):
    a, b = tmp_path / "part1.jsonl", tmp_path / "part2.jsonl"
    _write(
        a,
        [
            {
                "step": s,
                "data": {
                    "actor/entropy": 0.5 - 0.1 * s,
                    "critic/score/mean": 0.1 * s,
                    "perf/mfu": 0.3,
                    "stare/gate_on": float(s > 2),
                },
            }
            for s in (1, 2, 3)
        ],
    )
    # a resumed run re-logs step 3 and continues
    _write(
        b,
        [
            {
                "step": s,
                "data": {
                    "actor/entropy": 0.2,
                    "critic/score/mean": 0.9,
                    "stare/gate_on": 1.0,
                    "stare/target_entropy": 0.3,
                    "response_length/mean": 40 + s,
                    "bad": float("nan"),
                },
            }
            for s in (3, 4)
        ],
    )
    rows = read_verl_jsonl([a, b, tmp_path / "missing.jsonl"])
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["actor/entropy"] == 0.2 and rows[2]["critic/score/mean"] == 0.9
    kept = select_metrics(rows[0])
    assert "perf/mfu" not in kept and kept["actor/entropy"] == 0.4
    out = write_metrics_jsonl(rows, tmp_path / "run" / "metrics.jsonl")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 4 and "bad" not in lines[3] and lines[3]["response_length/mean"] == 44

    files = plot_run(rows, tmp_path / "plots")
    assert sorted(f.name for f in files) == ["entropy.png", "response_length.png", "reward.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_entropy_dynamics_plot_from_the_covariance_metrics(tmp_path):
    quads = ("pos_high", "pos_low", "neg_high", "neg_low", "zero_adv")
    rows = [
        {"step": s, "actor/entropy": 0.1, "stare/cov_logp_adv": 0.02 * s, "stare/cov_logp_adv_eff": 0.015 * s,
         **{f"stare/cov_quadrant_eff/{q}": 0.003 * s * (i + 1) for i, q in enumerate(quads)}}
        for s in (1, 2, 3)
    ]  # fmt: skip
    kept = select_metrics(rows[0])
    assert kept["stare/cov_logp_adv_eff"] == 0.015 and kept["stare/cov_quadrant_eff/zero_adv"] == 0.015
    files = plot_run(rows, tmp_path / "plots")
    assert sorted(f.name for f in files) == ["entropy.png", "entropy_dynamics.png"]
    assert (tmp_path / "plots" / "entropy_dynamics.png").read_bytes()[:4] == b"\x89PNG"
    # runs from before the metrics existed get no such plot
    assert [f.name for f in plot_run([{"step": 1, "actor/entropy": 0.1}], tmp_path / "old")] == ["entropy.png"]


def test_step_axes_tick_whole_steps_only(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    ticks = []
    real_savefig = plt.Figure.savefig

    def savefig(fig, *args, **kwargs):
        fig.canvas.draw()
        ticks.append([t for ax in fig.axes for t in ax.get_xticks() if ax.get_xlabel() == "step"])
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    rows = [{"step": s, "actor/entropy": 0.1 - 0.01 * s, "critic/score/mean": 0.5} for s in (1, 2, 3)]
    plot_run(rows, tmp_path / "plots")
    assert len(ticks) == 2 and all(ticks)  # entropy.png, reward.png
    # a 3-step run would otherwise get ticks at 1.0, 1.25, 1.5, ...
    assert all(float(t).is_integer() for per_fig in ticks for t in per_fig)
