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
