"""``--model NAME|PATH`` runs (stare_verl.jobs.pretrained and the train driver): the family's pretrained task (its
problems disjoint by expression, rows scored on the last number), the plan a dry run prints, clear errors, and the
held-out evaluation cache keyed by its settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stare_verl.jobs.families import job_family
from stare_verl.jobs.families.problems import problem_row, split_problems
from stare_verl.jobs.train import cached_eval_before, is_pretrained_recipe, parse_options
from tests.support.inprocess import run_main
from tests.support.model_folder import write_model_folder

REPO = Path(__file__).resolve().parents[3]


def test_the_pretrained_shortcot_task():
    fam = job_family("shortcot").for_pretrained()
    assert fam.name == "shortcot" and fam.cpu_recipe == "shortcot_real" and fam.is_pretrained
    assert dict(fam.reward_options) == {"last_number": True} and fam.distinct_expressions
    assert fam.for_pretrained() is fam and job_family(fam) is fam
    splits = split_problems(0, 60, 0, n_rl=200, family=fam)
    held = {p.expression for p in splits["heldout"]}
    train = {p.expression for p in splits["rl_train"]}
    assert len(held) == 60 and len(train) == 200 and not held & train  # never the same sum in another wording
    assert {len(p.expression.split()) for p in splits["heldout"]} <= {3, 5}  # two or three terms
    row = problem_row(splits["rl_train"][0], "train", 0, family=fam)
    assert row["extra_info"]["reward_options"] == {"last_number": True}
    assert row["prompt"] == [{"role": "user", "content": splits["rl_train"][0].question}]
    tiny_row = problem_row(splits["rl_train"][0], "train", 0, family="shortcot")
    assert "reward_options" not in tiny_row["extra_info"]


def test_the_reward_reads_the_last_number_only_when_asked():
    from envs.reward import compute_score

    lenient = {"reward_options": {"last_number": True}}
    assert compute_score(solution_str="3 + 4 = 7.", ground_truth="7", extra_info=lenient)["score"] == 1.0
    assert compute_score(solution_str="3 + 4 = 7.", ground_truth="7")["score"] == 0.0  # strict box by default
    assert compute_score(solution_str="It is 7, not 8", ground_truth="7", extra_info=lenient)["score"] == 0.0
    assert compute_score(solution_str="\\boxed{8} and later 7", ground_truth="7", extra_info=lenient)["score"] == 0.0
    assert compute_score(solution_str="no digits here", ground_truth="7", extra_info=lenient)["has_answer"] is False


def test_families_without_a_pretrained_task_say_so():
    with pytest.raises(ValueError, match="no task for a pretrained model"):
        job_family("longcot").for_pretrained()


def test_defaults_depend_on_the_model():
    tiny = parse_options([])
    real = parse_options(["--model", "smollm2-135m"])
    assert (tiny.steps, tiny.n_eval, tiny.eval_samples) == (30, 200, 1)
    assert (real.steps, real.n_eval, real.eval_samples) == (20, 100, 4)
    assert parse_options(["--model", "smollm2-135m", "--steps", "2"]).steps == 2
    assert is_pretrained_recipe("shortcot_real_stare") and not is_pretrained_recipe("shortcot_tiny_stare")


def _train(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m stare_verl.jobs.train ARGS`` in a process of its own, from the repository root."""
    import os

    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "stare_verl.jobs.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture
def train_here(monkeypatch, capsys):
    """``_train`` in this process (``stare_verl.jobs.train.main``, what ``python -m stare_verl.jobs.train`` runs;
    the package's ``__main__`` itself runs in test_train_dry_run.py's ``python -m`` test)."""
    from stare_verl.jobs.train import main

    return lambda args, env_extra: run_main(main, args, monkeypatch, capsys, env=env_extra, cwd=REPO)


def test_dry_run_plans_a_registered_model_and_a_folder(tmp_path, train_here):
    got = train_here(
        ["--family", "shortcot", "--model", "smollm2-135m", "--dry-run"], {"STARE_CACHE_DIR": str(tmp_path)}
    )
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "--config-name=shortcot_real_stare" in out and "smollm2-135m is not prepared" in out
    assert f"actor_rollout_ref.model.path={tmp_path.resolve()}/models/smollm2-135m" in out
    assert "data.max_prompt_length=1024" not in out and "-smollm2-135m" in out  # a run folder of its own
    folder = write_model_folder(tmp_path / "my-llm")
    got = train_here(["--family", "shortcot", "--model", str(folder), "--method", "grpo", "--dry-run"], {})
    assert got.returncode == 0, got.stderr
    assert "--config-name=shortcot_real_grpo" in got.stdout and f"model.path={folder.resolve()}" in got.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--family", "shortcot", "--model", "no-such-model"], "neither a registered model"),
    (["--family", "longcot", "--model", "smollm2-135m"], "no task for a pretrained model"),
])  # fmt: skip
def test_bad_models_are_one_line(tmp_path, train_here, args, message):
    """The run and its dry run alike: one line, exit 2; the run through ``python -m`` (the whole process's stderr
    is that line: no warning of an import before it), the dry run in this process."""
    for extra, run in (([], _train), (["--dry-run"], train_here)):
        got = run([*args, *extra, "--run-dir", str(tmp_path / "run")], {"STARE_CACHE_DIR": str(tmp_path)})
        assert got.returncode == 2
        assert message in got.stderr and "Traceback" not in got.stderr
        assert len(got.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_cached_eval_before_is_keyed(tmp_path):
    path = tmp_path / "eval_before.json"
    calls = []

    def evaluate(v):
        return lambda: calls.append(v) or {"T=0": {"accuracy": v}}

    key = {"model": "m", "n_eval": 10, "eval_samples": 4}
    assert cached_eval_before(path, key, evaluate(0.1)) == {"T=0": {"accuracy": 0.1}}
    assert cached_eval_before(path, key, evaluate(0.9)) == {"T=0": {"accuracy": 0.1}}  # reused
    assert cached_eval_before(path, {**key, "eval_samples": 1}, evaluate(0.5))["T=0"]["accuracy"] == 0.5
    (tmp_path / "eval_before.key.json").write_text("{torn")
    assert cached_eval_before(path, key, evaluate(0.3))["T=0"]["accuracy"] == 0.3
    path.write_text('{"T=0": {"accu')  # torn evaluation under a matching key
    assert cached_eval_before(path, key, evaluate(0.4))["T=0"]["accuracy"] == 0.4
    path.write_text("[1, 2]")  # a foreign file
    assert cached_eval_before(path, key, evaluate(0.6))["T=0"]["accuracy"] == 0.6
    assert calls == [0.1, 0.5, 0.3, 0.4, 0.6]
    assert json.loads((tmp_path / "eval_before.key.json").read_text()) == key


def test_the_stop_message_says_whether_a_checkpoint_exists(tmp_path):
    from stare_verl.jobs.runlog import RunFolder
    from stare_verl.jobs.train import resume_clause

    run = RunFolder(tmp_path / "run")
    assert resume_clause(run, 5) == ("No checkpoint was saved yet (the first comes at step 5): the same command "
                                      "starts RL again from its first step.")  # fmt: skip
    ckpts = tmp_path / "run" / "checkpoints"
    (ckpts / "global_step_5").mkdir(parents=True)
    (ckpts / "latest_checkpointed_iteration.txt").write_text("5")
    assert resume_clause(run, 5).startswith(f"The same command resumes from the last checkpoint in {ckpts}")
