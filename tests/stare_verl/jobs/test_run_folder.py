"""RunFolder (stare_verl.jobs.runlog): the paths of a run and the one meaning of "latest checkpoint" (verl's
tracker file naming an existing global_step_N), on real folders."""

import json
import os

import pytest

from stare_verl.jobs.runlog import (
    CHECKPOINT_TRACKER,
    SFT_HF_SUBDIR,
    RunFolder,
    has_hf_weights,
    latest_checkpoint_step,
    latest_hf_checkpoint,
)


def _step(root, n, weights=True, hf="actor/huggingface"):
    """A ``global_step_<n>`` folder as verl saves it; with ``weights`` its HF folder is loadable."""
    d = root / f"global_step_{n}" / hf
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if weights:
        (d / "model.safetensors").write_bytes(b"\0")
    return d


def _track(root, n, mtime=None):
    path = root / CHECKPOINT_TRACKER
    path.write_text(f"{n}\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_paths_of_a_run(tmp_path):
    run = RunFolder(str(tmp_path / "tooluse-stare-seed0"))
    p = run.path
    assert (run.checkpoints, run.logs, run.data, run.plots) == (
        p / "checkpoints", p / "logs", p / "data", p / "plots")
    assert (run.metrics, run.summary, run.train_log) == (p / "metrics.jsonl", p / "summary.json", p / "train.log")
    assert (run.eval_before, run.eval_after) == (p / "eval_before.json", p / "eval_after.json")
    assert run.checkpoint_step_dir(7) == p / "checkpoints" / "global_step_7"
    assert run.new_verl_metric_part().parent == p / "logs"
    assert run.new_verl_metric_part().name.startswith("verl_metrics.") and not p.exists()  # nothing created


def test_latest_checkpoint_is_the_trackers_step_with_weights(tmp_path):
    run = RunFolder(tmp_path / "run")
    assert run.latest_step() is None and run.latest_checkpoint() is None  # nothing saved yet
    ck = run.checkpoints
    _step(ck, 1)
    _step(ck, 3)
    assert run.latest_step() is None  # steps on disk but no tracker: verl would not resume either
    _track(ck, 1)
    assert run.latest_step() == 1 and run.latest_checkpoint() == ck / "global_step_1" / "actor" / "huggingface"
    _track(ck, 3)
    assert run.latest_step() == 3 and run.latest_checkpoint() == ck / "global_step_3" / "actor" / "huggingface"


def test_latest_checkpoint_without_weights_is_none_not_an_older_step(tmp_path):
    run = RunFolder(tmp_path / "run")
    _step(run.checkpoints, 1)
    hf = _step(run.checkpoints, 2, weights=False)  # saved without hf_model
    _track(run.checkpoints, 2)
    assert run.latest_step() == 2 and run.latest_checkpoint() is None
    assert not has_hf_weights(hf) and has_hf_weights(run.checkpoint_step_dir(1) / "actor" / "huggingface")


def test_tracker_pointing_at_a_deleted_step_or_garbage_means_none(tmp_path):
    run = RunFolder(tmp_path / "run")
    _step(run.checkpoints, 2)
    _track(run.checkpoints, 5)  # global_step_5 was deleted
    assert run.latest_step() is None and run.latest_checkpoint() is None
    (run.checkpoints / CHECKPOINT_TRACKER).write_text("five")
    assert latest_checkpoint_step(run.checkpoints) is None


def test_sft_layout_and_a_run_folder_that_is_verls_default_local_dir(tmp_path):
    sft = tmp_path / "sft"
    hf = _step(sft, 4, hf=SFT_HF_SUBDIR)
    _track(sft, 4)
    assert latest_hf_checkpoint(sft, SFT_HF_SUBDIR) == hf and latest_hf_checkpoint(sft) is None
    bare = RunFolder(tmp_path / "bare")  # main_ppo with trainer.default_local_dir=runs/bare
    _step(bare.path, 2)
    _track(bare.path, 2)
    assert bare.checkpoints == bare.path
    assert bare.latest_checkpoint() == bare.path / "global_step_2" / "actor" / "huggingface"


def test_newest_run_is_the_one_checkpointed_last(tmp_path):
    runs = tmp_path / "runs"
    assert RunFolder.newest(runs) is None  # no runs/ at all
    a, b, c, d = (RunFolder(runs / n) for n in ("a", "b", "c", "d"))
    _step(a.checkpoints, 5)
    _track(a.checkpoints, 5, mtime=2_000)
    _step(b.checkpoints, 2, weights=False)
    _track(b.checkpoints, 2, mtime=3_000)
    _step(c.checkpoints, 9)  # never recorded: not a candidate
    _step(d.checkpoints, 1)
    _track(d.checkpoints, 8, mtime=4_000)  # names a deleted step: not a candidate
    (runs / "notes.txt").write_text("x")
    assert RunFolder.newest(runs) == b  # the newest counts even without weights...
    assert b.latest_checkpoint() is None  # ...and then has no HF checkpoint
    _track(a.checkpoints, 5, mtime=3_000)  # same time: the larger step wins
    assert RunFolder.newest(runs) == a


def test_find_latest_checkpoint_of_the_evaluation(tmp_path):
    from stare_verl.jobs.evaluation.local import LocalCheckpointError, find_latest_checkpoint

    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(LocalCheckpointError, match="no checkpoint found"):
        find_latest_checkpoint(runs)
    old, new = RunFolder(runs / "old"), RunFolder(runs / "new")
    _step(old.checkpoints, 3)
    _track(old.checkpoints, 3, mtime=1_000)
    assert find_latest_checkpoint(runs) == old.checkpoints / "global_step_3" / "actor" / "huggingface"
    _step(new.checkpoints, 1, weights=False)
    _track(new.checkpoints, 1, mtime=2_000)
    with pytest.raises(LocalCheckpointError, match="global_step_1, has no HF weights"):
        find_latest_checkpoint(runs)


def test_metrics_summary_and_parts(tmp_path):
    run = RunFolder(tmp_path / "run")
    with pytest.raises(FileNotFoundError):
        run.read_summary()
    assert not run.is_finished() and run.verl_metric_parts() == []
    run.path.mkdir()
    run.metrics.write_text('{"step": 1, "actor/entropy": 0.5}\n\n{"step": 2, "actor/entropy": 0.25}\n')
    assert run.read_metrics() == [{"step": 1, "actor/entropy": 0.5}, {"step": 2, "actor/entropy": 0.25}]
    assert run.write_summary({"method": "stare", "seed": 0}) == run.summary
    assert run.is_finished() and run.read_summary() == {"method": "stare", "seed": 0}
    assert json.loads(run.summary.read_text()) == {"method": "stare", "seed": 0}
    run.logs.mkdir()
    for stamp in ("20260102-000000", "20260101-120000"):
        (run.logs / f"verl_metrics.{stamp}.jsonl").write_text("")
    (run.logs / "other.jsonl").write_text("")
    assert [p.name for p in run.verl_metric_parts()] == [
        "verl_metrics.20260101-120000.jsonl", "verl_metrics.20260102-000000.jsonl"]
