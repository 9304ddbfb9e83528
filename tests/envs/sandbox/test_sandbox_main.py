"""The program runs as module ``__main__``, as under a host ``python -c``: ``import __main__`` sees its names, what it
defines pickles, its ``if __name__ == "__main__":`` block runs, ``multiprocessing.Pool`` runs its functions, and
``dataclasses`` / ``typing`` find its module; in a session every call's names live in that one ``__main__``. Past the
process limit, a pool fails with an error that names the limit."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig, probe_backend

pytestmark = pytest.mark.integration

KINDS = [
    pytest.param(k, marks=pytest.mark.skipif(probe_backend(k) is not None, reason=f"{k} unusable here"))
    for k in ("bwrap", "unshare")
]
ALL_KINDS = [*KINDS, "subprocess"]

# Each program prints one line per member; the host's `python -c` prints the same lines.
PROGRAM = '''
from __future__ import annotations
import dataclasses, pickle, sys, typing
import multiprocessing as mp

x = 41

def add_one(v):
    return v + 1

class Box:
    def __init__(self, v):
        self.v = v

@dataclasses.dataclass
class Item:
    name: str
    box: Box  # a string annotation (future import) resolved in sys.modules[Item.__module__]
    tags: typing.ClassVar[int] = 0

import __main__
print("import", __main__.x, __main__.add_one is add_one, sys.modules["__main__"].__dict__ is globals())
print("pickle", pickle.loads(pickle.dumps(add_one))(1), pickle.loads(pickle.dumps(Box(7))).v)
print("hints", typing.get_type_hints(Item)["box"] is Box, [f.name for f in dataclasses.fields(Item)])
if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("pool", pool.map(add_one, range(4)))
'''
EXPECTED = "import 41 True True\npickle 2 7\nhints True ['name', 'box']\npool [1, 2, 3, 4]\n"


def _sandbox(kind: str, **limits) -> LocalSandbox:
    limits = ExecLimits(**{"timeout_s": 30, **limits})
    return LocalSandbox(kind, SandboxConfig(limits=limits, max_sessions=2, allow_unsafe=True))


def test_the_host_python_c_prints_the_expected_lines():
    """The reference: what a plain `python -c` of the program prints on the host."""
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert out.stdout == EXPECTED, out.stderr


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_cold_call_runs_as_main(kind):
    sb = _sandbox(kind)
    r = asyncio.run(sb.run(PROGRAM))
    assert (r.stdout, r.exit_code) == (EXPECTED, 0), r.stderr
    # A fresh module: nothing of the driver's in it.
    r = asyncio.run(sb.run("print(sorted(globals()))"))
    assert r.stdout == str(sorted(["__builtins__", "__doc__", "__loader__", "__name__", "__package__", "__spec__"])) + "\n"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_session_calls_share_one_main(kind):
    sb = _sandbox(kind)

    async def go():
        try:
            out = [await sb.run_in_session("k", PROGRAM)]
            # Names of the earlier call, reached through __main__, pickled and used by a pool in a later call.
            out.append(await sb.run_in_session("k", (
                "import __main__, pickle, multiprocessing as mp\n"
                "y = 1\n"
                "print(__main__.x, __main__.y, pickle.loads(pickle.dumps(Box(3))).v, pickle.loads(pickle.dumps(add_one)) is add_one)\n"
                "with mp.Pool(2) as pool:\n"
                "    print(pool.map(add_one, [x]))"
            )))
            # A call that replaced sys.modules["__main__"] does not take the next call's names away.
            out.append(await sb.run_in_session("k", "import sys, types\nsys.modules['__main__'] = types.ModuleType('m')"))
            out.append(await sb.run_in_session("k", "import __main__\nprint(__main__.y, __name__)"))
            return out
        finally:
            await sb.aclose()

    first, second, third, fourth = asyncio.run(go())
    assert (first.stdout, first.exit_code) == (EXPECTED, 0), first.stderr
    assert second.stdout == "41 1 3 True\n[42]\n", second.stderr
    assert third.exit_code == 0 and fourth.stdout == "1 __main__\n", fourth.stderr
    assert not fourth.session_restarted


@pytest.mark.parametrize("kind", KINDS)
def test_a_pool_past_the_process_limit_names_the_limit(kind):
    sb = _sandbox(kind, max_processes=4)
    if not sb.separate_uids:
        pytest.skip("RLIMIT_NPROC applies only under a separate uid (root host)")
    code = "import multiprocessing as mp\nwith mp.Pool(8) as pool:\n    print(pool.map(abs, [-1]))"
    r = asyncio.run(sb.run(code))
    assert r.exit_code == 1 and "BlockingIOError" in r.stderr, r
    assert r.stderr.rstrip().splitlines()[-1].startswith("[sandbox: at most 4 processes and threads may run at once")
    # An ordinary EAGAIN-free error gets no such note.
    r = asyncio.run(sb.run("raise BlockingIOError(35, 'other')"))
    assert r.exit_code == 1 and "RLIMIT_NPROC" not in r.stderr
