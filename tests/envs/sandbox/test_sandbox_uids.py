"""Each live sandbox holds its own uid range (a lock file per block of the machine's uid space): two processes sent to
the same preferred slot get different ranges, so do two pools whose uid_base differs but whose ranges would overlap
(neither kills the other's program), a range frees itself when its holder dies (even by SIGKILL), a forked child
takes a range of its own, and two sandboxes of one process never share one; uid_base has a floor. Root only (separate uids are only used as root)."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys

import pytest
from pydantic import ValidationError

from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig, SandboxUnavailable
from envs.sandbox.config import UID_BASE_MIN
from envs.sandbox.local import UID_BLOCK, UID_SLOT_SIZE, UID_SLOTS, _UidPool
from tests.support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.skipif(os.geteuid() != 0, reason="separate uids are only used when the host is root")]

BASE = SandboxConfig().uid_base
SLOT = 7  # the preferred slot forced on every process of a test

# A host process that builds a sandbox, runs one call in it under its uid, prints the range it holds and the uid
# the call ran under, then keeps the range until its stdin closes (or it is killed).
HOLDER = """
import asyncio, sys
from envs.sandbox import LocalSandbox, SandboxConfig
sb = LocalSandbox("subprocess", SandboxConfig(allow_unsafe=True))
r = asyncio.run(sb.run("import os; print(os.getuid())"))
print(sb._uids.slot, sb._uids.start, r.stdout.strip(), flush=True)
sys.stdin.read()
"""


def _holder(lock_dir: str) -> tuple[subprocess.Popen, tuple[int, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "STARE_SANDBOX_UID_LOCK_DIR": lock_dir,
           "STARE_SANDBOX_UID_SLOT": str(SLOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    assert line, "the holder process failed"
    slot, start, uid = (int(v) for v in line.split())
    return proc, (slot, start, uid)


def test_two_processes_on_the_same_slot_get_different_ranges_and_a_dead_holders_range_frees(tmp_path):
    a, (slot_a, start_a, uid_a) = _holder(str(tmp_path))
    b, (slot_b, start_b, uid_b) = _holder(str(tmp_path))
    try:
        assert (slot_a, start_a) == (SLOT, BASE + SLOT * UID_SLOT_SIZE)
        assert (slot_b, start_b) == (SLOT + 1, BASE + (SLOT + 1) * UID_SLOT_SIZE)  # the next slot, in order
        assert start_a <= uid_a < start_a + UID_SLOT_SIZE and start_b <= uid_b < start_b + UID_SLOT_SIZE
        # The holder dies without any clean-up: its slot is the first free one again.
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        c, (slot_c, start_c, _) = _holder(str(tmp_path))
        c.stdin.close()
        c.wait(timeout=30)
        assert (slot_c, start_c) == (slot_a, start_a)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def test_sandboxes_of_one_process_and_a_forked_child_never_share_a_range(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_SANDBOX_UID_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("STARE_SANDBOX_UID_SLOT", str(UID_SLOTS - 1))
    cfg = SandboxConfig(limits=ExecLimits(timeout_s=5))
    one, two = LocalSandbox("bwrap", cfg), LocalSandbox("bwrap", cfg)
    assert (one._uids.slot, two._uids.slot) == (UID_SLOTS - 1, 0)  # wraps around to slot 0
    assert set(one._uids.uids).isdisjoint(two._uids.uids) and len(one._uids.uids) == 8 + 64
    # A forked child that takes a uid claims the next free range; the parent's stays held by the parent.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery, only the pool
        try:
            uid = one._uids.take()
            os.write(w, f"{one._uids.slot} {uid}".encode())
        finally:
            os._exit(0)
    os.close(w)
    child_slot, child_uid = (int(v) for v in os.read(r, 100).split())
    os.close(r)
    os.waitpid(pid, 0)
    assert child_slot == 1 and child_uid in range(BASE + UID_SLOT_SIZE, BASE + 2 * UID_SLOT_SIZE)
    assert one._uids.slot == UID_SLOTS - 1 and one._uids.take() in one._uids.uids
    three = LocalSandbox("bwrap", cfg)
    assert three._uids.slot == 1  # the child's range was freed when it exited
    # Released (or collected), a range is free again.
    two._uids.release()
    del two
    assert LocalSandbox("bwrap", cfg)._uids.slot == 0


def test_bad_slot_setting_and_full_table_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_SANDBOX_UID_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("STARE_SANDBOX_UID_SLOT", "1000")
    with pytest.raises(ValueError, match="STARE_SANDBOX_UID_SLOT"):
        _UidPool(BASE, 8, True)
    monkeypatch.setenv("STARE_SANDBOX_UID_SLOT", "0")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # one lock descriptor per pool
    need = UID_SLOTS + 256
    if soft < need and hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE {hard} is too low to hold every slot")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        pools = [_UidPool(BASE, 8, True) for _ in range(UID_SLOTS)]
        assert sorted(p.slot for p in pools) == list(range(UID_SLOTS))
        with pytest.raises(SandboxUnavailable, match="all 1000 sandbox uid ranges are held"):
            _UidPool(BASE, 8, True)
        pools[500].release()
        assert _UidPool(BASE, 8, True).slot == 500
        for pool in pools:
            pool.release()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_default_lock_directory_is_used(monkeypatch):
    monkeypatch.delenv("STARE_SANDBOX_UID_LOCK_DIR", raising=False)
    monkeypatch.delenv("STARE_SANDBOX_UID_SLOT", raising=False)
    pool = _UidPool(BASE, 8, True)
    path = f"/run/stare-verl-sandbox-uids/uids-{pool.start // UID_BLOCK}.lock"
    assert open(path).read() == f"{os.getpid()}\n"


# A host process whose sandbox has its own uid_base (argv[1]): prints its range, then runs a 3 s call under its uid
# and prints how the call ended.
SLEEPER = """
import asyncio, sys
from envs.sandbox import ExecLimits, LocalSandbox, SandboxConfig
sb = LocalSandbox("subprocess", SandboxConfig(allow_unsafe=True, uid_base=int(sys.argv[1])))
print(sb._uids.slot, sb._uids.start, flush=True)
r = asyncio.run(sb.run("import os, time; print(os.getuid()); time.sleep(3); print('done')", ExecLimits(timeout_s=30)))
print(r.exit_code, " ".join(r.stdout.split()), flush=True)
"""


def test_pools_with_different_uid_bases_never_share_a_uid_nor_kill_each_others_programs(tmp_path, monkeypatch):
    # A: uid_base 200000, slot 10 -> uids from 281920. B: uid_base 281920, slot 0 -> the same uids, were the lock per
    # slot number (B's clean-up after its call then killed A's program: exit 137). The lock is per block of uids.
    a_base, b_base = 200000, 200000 + 10 * UID_SLOT_SIZE
    env = {**os.environ, "PYTHONPATH": str(REPO), "STARE_SANDBOX_UID_LOCK_DIR": str(tmp_path),
           "STARE_SANDBOX_UID_SLOT": "10"}
    a = subprocess.Popen([sys.executable, "-c", SLEEPER, str(a_base)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        slot_a, start_a = (int(v) for v in a.stdout.readline().split())
        assert (slot_a, start_a) == (10, b_base)
        monkeypatch.setenv("STARE_SANDBOX_UID_LOCK_DIR", str(tmp_path))
        monkeypatch.setenv("STARE_SANDBOX_UID_SLOT", "0")
        b = LocalSandbox("subprocess", SandboxConfig(allow_unsafe=True, uid_base=b_base))
        assert b._uids.slot == 1 and set(b._uids.uids).isdisjoint(range(start_a, start_a + UID_SLOT_SIZE))
        r = asyncio.run(b.run("import os; print(os.getuid())"))
        assert r.exit_code == 0 and int(r.stdout) in b._uids.uids
        asyncio.run(b.aclose())
        status, out = a.stdout.readline().split(maxsplit=1)
        assert int(status) == 0 and out.split()[1] == "done"  # A's program outlived B's call and clean-up
        assert int(out.split()[0]) in range(start_a, start_a + UID_SLOT_SIZE)
    finally:
        if a.poll() is None:
            a.kill()
        a.wait(timeout=30)


def test_a_range_across_two_blocks_holds_both_and_uid_base_has_a_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_SANDBOX_UID_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("STARE_SANDBOX_UID_SLOT", "0")
    edge = 30 * UID_BLOCK
    straddling = _UidPool(edge - 4, 8, True)  # uids [edge - 4, edge + 4): blocks 29 and 30
    assert straddling.slot == 0 and sorted(os.listdir(tmp_path)) == ["uids-29.lock", "uids-30.lock"]
    assert _UidPool(edge, 8, True).slot == 1  # block 30 is held: the next slot
    assert _UidPool(edge - 8, 8, True).slot == 2  # slot 0 is in block 29, slot 1 in block 30: both held
    straddling.release()
    assert _UidPool(edge, 8, True).slot == 0
    for low in (0, 1000, UID_BASE_MIN - 1):
        with pytest.raises(ValidationError, match="uid_base"):
            SandboxConfig(uid_base=low)
        with pytest.raises(ValueError, match="uid_base"):
            _UidPool(low, 8, True)
    with pytest.raises(ValidationError, match="uid_base"):
        SandboxConfig(uid_base=2**31)
    assert SandboxConfig(uid_base=UID_BASE_MIN).uid_base == UID_BASE_MIN
