"""The run-folder overlay (stare_verl.jobs.curves): values read from verl's metric parts of finished and running runs,
a resumed run's later part winning, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare_verl.jobs.curves import main, plot_curves, run_curves


def _run(tmp: Path, name: str, parts: list[list[dict]]) -> Path:
    logs = tmp / name / "logs"
    logs.mkdir(parents=True)
    for i, rows in enumerate(parts):
        (logs / f"verl_metrics.2026120{i}-000000.jsonl").write_text(
            "".join(json.dumps({"step": r.pop("step"), "data": r}) + "\n" for r in rows) + "not json\n"
        )
    return tmp / name


def test_curves_read_the_parts_and_prefer_the_shared_namespace(tmp_path):
    run = _run(tmp_path, "a", [
        [{"step": 1, "entropy_control/batch_entropy": 2.0, "stare/batch_entropy": 9.0, "critic/score/mean": 0.25,
          "entropy_control/target_entropy": 1.5, "entropy_control/cov_logp_adv_eff": 0.01},
         {"step": 2, "actor/entropy": 1.8, "reward/acc/mean": 0.5}],
        [{"step": 2, "stare/batch_entropy": 1.7, "critic/score/mean": 0.75}],
    ])  # fmt: skip
    c = run_curves(run)
    assert c["step"] == [1, 2]
    assert c["entropy"] == [2.0, 1.7]  # the resumed part's step 2 wins over the first part's
    assert c["reward"] == [0.25, 0.75]
    assert c["target"] == [1.5, None] and c["cov"] == [0.01, None]
    twin = _run(tmp_path, "twin", [[{"step": s, "stare/w": 1.0, "stare/m": 1.0, "stare/target_entropy": 1.5,
                                     "actor/entropy": 2.0} for s in (1, 2)]])  # fmt: skip
    assert run_curves(twin)["target"] == [None, None]  # GRPO-ds: a target it never acts on
    acting = _run(tmp_path, "acting", [[{"step": 1, "stare/w": 1.0, "stare/target_entropy": 1.5},
                                        {"step": 2, "stare/w": 1.5, "stare/target_entropy": 1.5}]])  # fmt: skip
    assert run_curves(acting)["target"] == [1.5, 1.5]


def test_plot_and_cli(tmp_path, capsys):
    a = _run(tmp_path, "a", [[{"step": s, "actor/entropy": 2.0 - 0.1 * s, "critic/score/mean": 0.1 * s}
                              for s in range(1, 6)]])  # fmt: skip
    b = _run(tmp_path, "b", [[{"step": s, "actor/entropy": 2.0, "critic/score/mean": 0.0} for s in range(1, 4)]])
    out = plot_curves([a, b], tmp_path / "fig" / "o.png", labels=["grpo", "stare"], title="t", smooth=2)
    assert out.is_file() and out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="2 labels for 1 runs"):
        plot_curves([a], tmp_path / "x.png", labels=["a", "b"])
    empty = tmp_path / "empty"
    (empty / "logs").mkdir(parents=True)
    assert main([str(empty), "--out", str(tmp_path / "e.png")]) == 2
    assert "no run has a logged step" in capsys.readouterr().err
    assert not (tmp_path / "e.png").exists()
