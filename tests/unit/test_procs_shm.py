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
