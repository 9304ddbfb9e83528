"""Issue 14, item 1: whatever goes wrong inside the verifier (time budget used up, exception, killed worker) is
never remembered as an answer, is counted, and a pair's verdict depends neither on load nor on which pair came
first. Failures are forced with tiny budgets and patched slow or broken workers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from envs.reward import compute_score
from envs.scoring import (
    MathVerifyPool,
    Verdict,
    answers_equal,
    clear_verdict_cache,
)
from envs.scoring import verify as verify_mod

pytestmark = pytest.mark.integration

RATIO = ("7:32", r"S_{MBCN}:S=7:32")  # the example: math-verify says equal, slowly
SYMBOLIC = [(r"(x+1)^2", r"x^2+2x+1"), (r"\frac{\pi}{2}", r"\pi/2"), RATIO, (r"(x+1)^{3}", r"x^3+3x^2+3x+1")]


def _worker_with(prelude: str) -> list[str]:
    """argv of a real math-verify worker with ``prelude`` run first (to patch math_verify)."""
    code = textwrap.dedent(prelude) + "\nfrom envs.scoring import _mv_worker\nraise SystemExit(_mv_worker.main())\n"
    return [sys.executable, "-c", code]


# Patched math_verify.verify that burns CPU (or sleeps) before answering when the prediction mentions MBCN.
_SLOW = """
import time, math_verify
_orig = math_verify.verify
def _slow(gold, pred, **kw):
    if "MBCN" in str(pred) or "MBCN" in str(gold):
        t = {clock}()
        while {clock}() - t < {seconds}:
            {step}
    return _orig(gold, pred, **kw)
math_verify.verify = _slow
"""


def _slow_worker(seconds: float, cpu: bool) -> list[str]:
    if cpu:
        return _worker_with(_SLOW.format(clock="time.process_time", seconds=seconds, step="pass"))
    return _worker_with(_SLOW.format(clock="time.monotonic", seconds=seconds, step="time.sleep(0.01)"))


@pytest.fixture
def one_worker():
    pools = []

    def make(**kw) -> MathVerifyPool:
        p = MathVerifyPool(max_workers=1, **kw)
        pools.append(p)
        return p

    clear_verdict_cache()
    yield make
    for p in pools:
        p.close()
    clear_verdict_cache()


# ------------------------------------------------------------------ item 1: a verifier failure is not a verdict


@pytest.mark.parametrize("pred, gold", SYMBOLIC)
def test_a_tiny_budget_times_out_and_the_same_pair_then_scores_correctly(pred, gold, one_worker):
    pool = one_worker()
    assert pool.prewarm(1, wait_s=120)
    v = answers_equal(pred, gold, timeout_s=1e-4, pool=pool)
    assert v == Verdict(None, "timeout") and v.failed
    assert pool.failures == 1 and pool.kills == 0  # the worker stopped itself (CPU budget) and lives on
    assert not verify_mod._VERDICTS  # nothing remembered in the parent
    # the same worker (its parse cache) and the same parent cache: a normal budget gives the right verdict
    v = answers_equal(pred, gold, timeout_s=10.0, pool=pool)
    assert v == Verdict(True, "math_verify")
    assert pool.failures == 1 and len(pool._all) == 1


def test_a_slow_verify_times_out_then_scores_with_a_larger_budget(one_worker):
    # a generous wall-clock backstop: on a loaded machine 0.5 s of CPU can take seconds
    pool = one_worker(worker_command=_slow_worker(1.5, cpu=True), wall_factor=40.0)
    assert pool.prewarm(1, wait_s=120)
    v = answers_equal(*RATIO, timeout_s=0.5, pool=pool)
    assert v == Verdict(None, "timeout")
    assert pool.kills == 0  # the CPU budget fired inside the worker, no wall-clock kill
    assert answers_equal(*RATIO, timeout_s=5.0, pool=pool) == Verdict(True, "math_verify")


def test_waiting_is_not_counted_only_cpu_time_is(one_worker):
    """A check that is slow in wall-clock time but uses little CPU (a loaded machine) still gets its verdict."""
    pool = one_worker(worker_command=_slow_worker(1.5, cpu=False), wall_factor=10.0)
    assert pool.prewarm(1, wait_s=120)
    t0 = time.monotonic()
    assert answers_equal(*RATIO, timeout_s=1.0, pool=pool) == Verdict(True, "math_verify")
    assert 1.4 < time.monotonic() - t0 < 11.0 and pool.failures == 0


def test_a_killed_or_crashing_worker_is_an_error_never_remembered(one_worker):
    dies = _worker_with("""
import os, sys
import envs.scoring._mv_worker as w
_orig = w.make_checker
def make():
    check = _orig()
    def boom(pairs):
        if any("MBCN" in g + p for g, p in pairs):
            os._exit(9)
        return check(pairs)
    boom.cache = check.cache
    return boom
w.make_checker = make
""")
    pool = one_worker(worker_command=dies)
    assert answers_equal(*RATIO, timeout_s=5.0, pool=pool) == Verdict(None, "error")
    assert not verify_mod._VERDICTS and pool.failures == 1 and not pool._all
    # an exception inside the checker: the worker answers {"error": ...}
    raises = _worker_with("""
import envs.scoring._mv_worker as w
_orig = w.make_checker
def make():
    check = _orig()
    def boom(pairs):
        if any("MBCN" in g + p for g, p in pairs):
            raise RuntimeError("checker broke")
        return check(pairs)
    boom.cache = check.cache
    return boom
w.make_checker = make
""")
    pool2 = one_worker(worker_command=raises)
    assert answers_equal(*RATIO, timeout_s=5.0, pool=pool2) == Verdict(None, "error")
    assert not verify_mod._VERDICTS and len(pool2._all) == 1  # the worker lives on
    # a good worker then decides the same pair
    good = one_worker()
    assert answers_equal(*RATIO, timeout_s=10.0, pool=good) == Verdict(True, "math_verify")


def test_a_worker_that_hangs_in_c_code_is_killed_and_the_pair_is_not_remembered(one_worker):
    hang = [sys.executable, "-c", "import json, time; print(json.dumps({'ready': True}), flush=True); time.sleep(600)"]
    pool = one_worker(worker_command=hang, wall_factor=1.0, wall_margin_s=0.2)
    assert answers_equal(*RATIO, timeout_s=0.5, pool=pool) == Verdict(None, "timeout")
    assert pool.kills == 1 and not verify_mod._VERDICTS


def test_the_verdict_does_not_depend_on_which_pair_came_first(one_worker):
    pairs = [RATIO, (r"(x+1)^2", r"x^2+2x+2"), (r"\frac{\pi}{2}", r"\pi/2")]
    expected = [True, False, True]
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        clear_verdict_cache()
        pool = one_worker()
        # a forced timeout of every pair first, then the real checks in this order
        for i in order:
            assert answers_equal(*pairs[i], timeout_s=1e-4, pool=pool).failed
        got = {i: answers_equal(*pairs[i], timeout_s=10.0, pool=pool).equal for i in order}
        assert [got[i] for i in range(3)] == expected, order


def test_worker_parse_cache_keeps_only_finished_parses():
    from envs.scoring import _mv_worker

    check = _mv_worker.make_checker()
    timer = _mv_worker.CpuTimer()
    req = json.dumps({"pairs": [list(RATIO)], "budget_s": 1e-5})
    assert _mv_worker.answer(req, check, timer) == {"timeout": True}
    assert not check.cache  # nothing half-parsed stays
    assert _mv_worker.answer(json.dumps({"pairs": [list(RATIO)], "budget_s": 10}), check, timer) == {"equal": True}
    assert set(check.cache) == set(RATIO)
    assert _mv_worker.answer("not json", check, timer)["error"].startswith("JSONDecodeError")
    assert _mv_worker.answer(json.dumps({"budget_s": 1}), check, timer)["error"].startswith("KeyError")


class _MissedTicks:
    """A CpuTimer whose alarm never fires: what a check sees on a loaded machine when it is preempted between the
    kernel's ticks and finishes before one lands while it runs (a CI run at load 7 scored a 1e-4 s check)."""

    def arm(self, seconds: float) -> None:
        pass

    def disarm(self) -> None:
        pass


@pytest.mark.parametrize("pair", [(r"(x+1)^2", r"x^2+2x+1"), RATIO, (r"\frac{\pi}{2}", r"\pi/2"), ("12", "x^2+2x+1")])
def test_a_check_over_budget_is_a_timeout_even_when_the_alarm_misses_it(pair):
    """The budget is CPU time, whatever the load: a check that used more than its budget is answered timeout
    (and leaves the parse cache as it was) even when the alarm did not fire; within budget it gets its verdict."""
    from envs.scoring import _mv_worker

    check = _mv_worker.make_checker()
    check([("1", "1")])  # one parse in the cache before, which must stay
    before = dict(check.cache)
    for budget in (1e-5, 1e-4):
        req = json.dumps({"pairs": [list(pair)], "budget_s": budget})
        assert _mv_worker.answer(req, check, _MissedTicks()) == {"timeout": True}, budget
        assert dict(check.cache) == before
    t0 = time.process_time()
    got = _mv_worker.answer(json.dumps({"pairs": [list(pair)], "budget_s": 10.0}), check, _MissedTicks())
    assert got == {"equal": pair[0] != "12"} and time.process_time() - t0 > 1e-4  # the work is over 0.1 ms
    assert set(check.cache) == set(before) | set(pair)


def test_reward_counts_a_timeout_and_a_later_call_scores_right(one_worker, monkeypatch):
    pool = one_worker()
    monkeypatch.setattr(verify_mod, "_POOL", pool)
    pred, gold = r"(x+1)^{3}", r"x^3+3x^2+3x+1"  # only math-verify can decide it
    response = r"The expansion is \boxed{" + pred + "}"
    r = compute_score("x", response, gold, timeout_s=1e-4)
    assert (r["acc"], r["score"], r["timed_out"], r["verify_method"]) == (False, 0.0, True, "timeout")
    r = compute_score("x", response, gold, timeout_s=10.0)
    assert (r["acc"], r["score"], r["timed_out"], r["verify_method"]) == (True, 1.0, False, "math_verify")
    # the labelled ratio no longer needs math-verify at all: the reward reads the label off (issue 31)
    r = compute_score("x", r"The ratio is \boxed{" + RATIO[1] + "}", RATIO[0], timeout_s=1e-4)
    assert (r["acc"], r["timed_out"], r["verify_method"]) == (True, False, "exact")
    # several ground truths: a failure on one is reported unless another matched
    r = compute_score("x", r"\boxed{x^2+2x+1}", ["12", "(x+1)^2"], timeout_s=1e-4)
    assert r["timed_out"] is True and r["acc"] is False and r["verify_method"] == "timeout"
    r = compute_score("x", r"\boxed{12}", [gold, "12"], timeout_s=1e-4)
    assert r["timed_out"] is False and r["acc"] is True and r["verify_method"] == "exact"
    # an empty ground truth is no checker failure
    r = compute_score("x", r"\boxed{12}", r"\boxed{}", timeout_s=5.0)
    assert r["timed_out"] is False and r["verify_method"] == "no_ground_truth"


def test_no_worker_process_falls_back_inline_with_the_same_budget(monkeypatch):
    """When no worker can be started (OSError), the check runs in this process under the same CPU budget."""
    pool = MathVerifyPool(max_workers=1)
    clear_verdict_cache()

    def no_process(*a, **k):
        raise OSError("no processes")

    monkeypatch.setattr(verify_mod, "_Worker", no_process)
    try:
        pair = ("5:9", r"S_{XYZ}:S=5:9")  # not parsed before in this process (math-verify caches parses too)
        assert answers_equal(*pair, timeout_s=1e-5, pool=pool) == Verdict(None, "timeout")
        assert answers_equal(*pair, timeout_s=10.0, pool=pool) == Verdict(True, "math_verify")
    finally:
        pool.close()
        clear_verdict_cache()


def test_the_worker_speaks_the_documented_protocol():
    """The worker answers the documented protocol on its own (ready, verdict, timeout, error, exit on EOF)."""
    proc = subprocess.Popen([sys.executable, "-m", "envs.scoring._mv_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        for req, reply in (({"pairs": [list(RATIO)], "budget_s": 10}, {"equal": True}),
                           ({"pairs": [["x^2+4x+4", "(x+2)^2"]], "budget_s": 1e-5}, {"timeout": True})):
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == reply
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_goes_with_its_parent_even_while_starting():
    """A process that starts a worker and ends at once (before the worker has even imported math-verify)
    leaves nothing behind."""
    parent = (
        "import os\n"
        "from envs.scoring import MathVerifyPool\n"
        "p = MathVerifyPool(max_workers=1)\n"
        "p.prewarm(1, wait_s=0)\n"
        "print(next(iter(p._all)).proc.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    wpid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 15
    alive = True
    while alive and time.monotonic() < deadline:
        try:
            with open(f"/proc/{wpid}/stat") as fh:
                alive = fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            alive = False
        time.sleep(0.1)
    assert not alive, f"math-verify worker {wpid} outlived its parent"


# ------------------------------------------------ the evaluation keeps a missing verdict apart and scores it again


@pytest.mark.parametrize("broken", ["hangs", "dies"])
def test_the_evaluation_records_a_failed_check_as_unverified_and_a_resume_scores_it(tmp_path, one_worker, monkeypatch,
                                                                                    broken):  # fmt: skip
    import asyncio

    from stare_verl.jobs.evaluation.episode import EvalProblem, Sample, TurnResult, run_episode
    from stare_verl.jobs.evaluation.runner import EvalSettings, ResultsFile, resume_split
    from stare_verl.jobs.evaluation.summary import summarize

    bad = {"hangs": [sys.executable, "-c", "import json, time; print(json.dumps({'ready': True}), flush=True); "
                     "time.sleep(600)"],
           "dies": [sys.executable, "-c", "import json; print(json.dumps({'ready': True}), flush=True)"]}[broken]
    monkeypatch.setattr(verify_mod, "_POOL", one_worker(worker_command=bad, wall_factor=1.0, wall_margin_s=0.2))
    problem = EvalProblem(0, "toy/test/0", "toy", [{"role": "user", "content": "expand"}], r"x^3+3x^2+3x+1",
                          {"family": "short_cot"})

    async def generate(req):
        return TurnResult(text=r"\boxed{(x+1)^{3}}", completion_tokens=9, prompt_tokens=3)

    rec = asyncio.run(run_episode(Sample(problem, 0, 0), generate, max_tokens=64, max_turns=1))
    want = "timeout" if broken == "hangs" else "error"
    assert (rec.verdict, rec.verify_method, rec.correct, rec.score) == ("unverified", want, False, 0.0)
    settings = EvalSettings(k=1, max_tokens=64)
    out = tmp_path / "out.jsonl"
    rf = ResultsFile(out, settings.fingerprint("m", tmp_path / "d.jsonl"))
    rf.append(rec.model_dump())
    rf.close()
    assert summarize([rec.model_dump()])["groups"]["all"]["unverified"] == 1
    monkeypatch.setattr(verify_mod, "_POOL", one_worker())  # a working checker
    rf = ResultsFile(out, settings.fingerprint("m", tmp_path / "d.jsonl"))
    try:
        done, todo = resume_split([problem], settings, rf)
    finally:
        rf.close()
    assert todo == [] and (done[0]["verdict"], done[0]["verify_method"], done[0]["score"]) == (
        "correct", "math_verify", 1.0)  # fmt: skip
    assert json.loads(out.read_text())["verdict"] == "correct"
