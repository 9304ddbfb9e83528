"""remove_orphan_shm: the shared-memory segments a run left behind go, those a live process maps stay."""

from __future__ import annotations

import mmap
import time

from stare_verl.jobs.procs import remove_orphan_shm


def test_only_new_unmapped_segments_with_a_run_prefix_go(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    old = shm / "psm_old"
    old.write_bytes(b"x" * 4096)  # made before the run started: another run's, kept
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    for name in ("psm_left", "verl_weights_abc", "sem.mp-xyz", "psm_mapped", "other_segment"):
        (shm / name).write_bytes(b"x" * 4096)
    with open(shm / "psm_mapped", "r+b") as f, mmap.mmap(f.fileno(), 4096) as held:
        removed = remove_orphan_shm(since, shm_dir=str(shm))
        assert held[:1] == b"x"
    assert removed == ["psm_left", "sem.mp-xyz", "verl_weights_abc"]
    assert sorted(p.name for p in shm.iterdir()) == ["other_segment", "psm_mapped", "psm_old"]
    assert remove_orphan_shm(since, shm_dir=str(tmp_path / "missing")) == []


def test_a_live_named_semaphore_is_kept(tmp_path):
    """glibc's sem_open maps a temporary ``sem.XXXXXX``, links it to ``sem.<name>`` and unlinks the temporary
    name: the live semaphore shows in /proc/<pid>/maps only as ``sem.XXXXXX (deleted)``. Found by its inode, it
    stays (a concurrent vLLM engine's spawned workers open it later); once nothing maps it, it goes."""
    import os

    shm = tmp_path / "shm"
    shm.mkdir()
    since = time.time() - 1.0
    tmp = shm / "sem.Ab3xYz"
    tmp.write_bytes(b"\0" * 4096)
    with open(tmp, "r+b") as f, mmap.mmap(f.fileno(), 4096) as held:
        os.link(tmp, shm / "sem.mp-live")
        tmp.unlink()
        assert remove_orphan_shm(since, shm_dir=str(shm)) == []
        assert (shm / "sem.mp-live").exists() and held[:1] == b"\0"
    assert remove_orphan_shm(since, shm_dir=str(shm)) == ["sem.mp-live"]


def test_a_real_multiprocessing_semaphore_is_kept():
    """The same with Python's own: a spawn-context lock (vLLM's kind) under /dev/shm survives the clean-up; only
    its own name is offered to it (no other process's segment is touched)."""
    import multiprocessing as mp
    import os

    lock = mp.get_context("spawn").Lock()
    name = "sem." + lock._semlock.name.lstrip("/")
    if not os.path.exists(os.path.join("/dev/shm", name)):
        import pytest

        pytest.skip("named semaphores are not under /dev/shm here")
    assert remove_orphan_shm(time.time() - 60, prefixes=(name,)) == []
    assert os.path.exists(os.path.join("/dev/shm", name))
    del lock
