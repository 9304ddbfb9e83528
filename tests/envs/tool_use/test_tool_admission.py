"""A tool call's deadline starts when the tool has a free slot (``ToolCallRunner``, ``max_concurrent_calls``): an
evaluation of 800 episodes on 8 sandbox slots on a loaded machine timed half its calls out while they queued
(held-out T = 1 accuracy 0.53 instead of 0.86), in the training loop, the held-out evaluation and the API
evaluation alike, since all three run calls through this runner."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from envs.tool_use.episode import EpisodeStats, ToolCallRunner
from envs.tool_use.parser import ParsedCall


class SlowTool:
    """A verl-shaped tool whose calls take ``seconds`` each, at most ``slots`` at once (its own semaphore, as the
    sandbox has), reporting how many ran together."""

    def __init__(self, slots: int, seconds: float, say_slots="slots"):
        self.slots, self.seconds = slots, seconds
        if say_slots == "slots":  # the truth; False: no attribute at all; anything else: that value
            self.max_concurrent_calls = slots
        elif say_slots is not False:
            self.max_concurrent_calls = say_slots
        self.inside = self.most_inside = 0
        self._sem = {}

    async def create(self, create_kwargs=None):
        return "id", None

    async def execute(self, instance_id, arguments, agent_data=None):
        loop = asyncio.get_running_loop()
        sem = self._sem.setdefault(loop, asyncio.Semaphore(self.slots))
        async with sem:  # the tool's own slots: a call past them waits here
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            await asyncio.sleep(self.seconds)
            self.inside -= 1
        return "ok", 0.0, {}

    async def release(self, instance_id):
        return None


def _call():
    return ParsedCall("<tool_call>{}</tool_call>", name="t", arguments={"code": "print(1)"})


async def _episodes(tool, n: int, deadline: float, one_runner: bool) -> list[EpisodeStats]:
    shared = ToolCallRunner({"t": tool}, tool_timeout_s=deadline)
    stats = [EpisodeStats() for _ in range(n)]
    ctx = SimpleNamespace(request_id="r")

    async def one(st):  # the training loop builds a runner per sample: the slots must hold across runners
        runner = shared if one_runner else ToolCallRunner({"t": tool}, tool_timeout_s=deadline)
        return await runner.answer(0, _call(), st, ctx)

    texts = await asyncio.gather(*(one(st) for st in stats))
    assert all(t == "ok" for t, st in zip(texts, stats, strict=True) if not st.num_tool_timeouts)
    return stats


@pytest.mark.parametrize("one_runner", [True, False])
def test_queued_calls_wait_for_a_slot_instead_of_timing_out(one_runner):
    tool = SlowTool(slots=2, seconds=0.2)
    t0 = time.perf_counter()
    stats = asyncio.run(_episodes(tool, 12, deadline=0.6, one_runner=one_runner))
    assert sum(st.num_tool_timeouts for st in stats) == 0
    assert sum(st.num_tool_executed for st in stats) == 12
    assert tool.most_inside == 2 and time.perf_counter() - t0 >= 6 * 0.2 * 0.9  # six rounds of two
    assert all(st.tool_time_s < 0.6 for st in stats)  # time in the tool, not in the queue


@pytest.mark.parametrize("say", [False, None, 0, -1, True, "2", 2.0])
def test_a_tool_that_does_not_say_its_slots_keeps_the_old_deadline(say):
    """Without a usable ``max_concurrent_calls`` the deadline covers the queue, as before: the late calls time
    out (this is the failure the slots prevent)."""
    tool = SlowTool(slots=2, seconds=0.2, say_slots=say)
    stats = asyncio.run(_episodes(tool, 12, deadline=0.5, one_runner=True))
    assert sum(st.num_tool_timeouts for st in stats) >= 4


def test_a_hung_call_still_times_out_and_frees_its_slot():
    tool = SlowTool(slots=1, seconds=5.0)
    t0 = time.perf_counter()
    stats = asyncio.run(_episodes(tool, 2, deadline=0.3, one_runner=True))
    assert [st.num_tool_timeouts for st in stats] == [1, 1]  # one after the other, each at its own deadline
    assert time.perf_counter() - t0 < 2.0


def test_slots_follow_the_event_loop_and_the_tools_setting():
    """An evaluation runs one event loop per temperature: the same tool is admitted in each; a changed
    ``max_concurrent_calls`` takes effect."""
    tool = SlowTool(slots=3, seconds=0.05)
    for _ in range(2):
        stats = asyncio.run(_episodes(tool, 9, deadline=0.5, one_runner=False))
        assert sum(st.num_tool_executed for st in stats) == 9 and tool.most_inside == 3
    tool.max_concurrent_calls = 1
    tool.most_inside = 0
    asyncio.run(_episodes(tool, 4, deadline=0.5, one_runner=False))
    assert tool.most_inside == 1


def test_the_code_interpreter_says_its_sandbox_slots():
    from envs.tools.code_interpreter import CodeInterpreterTool

    try:
        tool = CodeInterpreterTool({"type": "native", "sandbox": {"max_concurrency": 5}})
    except Exception as err:  # noqa: BLE001 - no sandbox backend on this machine
        pytest.skip(f"no sandbox: {err}")
    assert tool.max_concurrent_calls == 5
    tool.cfg.persistent_session = True  # a session has its own interpreter: no shared slots
    assert tool.max_concurrent_calls is None
