"""What a test run left behind on this machine: ``python -m tests.support.leftovers snapshot FILE`` before the suite,
``python -m tests.support.leftovers check FILE`` after it (``.ci/run``). The check lists processes that are new
since the snapshot and belong to us (a run tag ``STARE_VERL_RUN_TAG`` in their environment, Ray daemons and
workers, our sandbox's bwrap), new ``/dev/shm`` entries and new bwrap / tmpfs mounts, waits up to 30 s for them
to go, and exits 1 when any remain (an orphan can hang CI or the next run)."""

from __future__ import annotations

import json
import os
import sys
import time

_OURS = ("raylet", "gcs_server", "ray::", "default_worker.py", "bwrap", "main_ppo", "_mv_worker", "envs.sandbox")


def _processes() -> dict[str, str]:
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/environ", "rb") as f:
                tagged = b"STARE_VERL_RUN_TAG=" in f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (tagged or any(k in cmd for k in _OURS)):
            out[pid] = cmd[:200]
    return out


def _shm() -> list[str]:
    try:
        return sorted(os.listdir("/dev/shm"))
    except OSError:
        return []


def _mounts() -> list[str]:
    with open("/proc/mounts") as f:
        return sorted(line.strip() for line in f if "bwrap" in line or "stare" in line)


def snapshot() -> dict:
    return {"processes": _processes(), "shm": _shm(), "mounts": _mounts()}


def new_since(before: dict) -> dict:
    now = snapshot()
    return {
        "processes": {p: c for p, c in now["processes"].items() if p not in before["processes"]},
        "shm": [s for s in now["shm"] if s not in before["shm"]],
        "mounts": [m for m in now["mounts"] if m not in before["mounts"]],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print("usage: python -m tests.support.leftovers snapshot|check FILE", file=sys.stderr)
        return 2
    cmd, path = argv
    if cmd == "snapshot":
        with open(path, "w") as f:
            json.dump(snapshot(), f)
        return 0
    with open(path) as f:
        before = json.load(f)
    deadline = time.time() + 30
    while (left := new_since(before)) and any(left.values()) and time.time() < deadline:
        time.sleep(1)
    if any(left.values()):
        print("leftovers after the test suite:", json.dumps(left, indent=1), file=sys.stderr)
        return 1
    print("leftovers: no process, /dev/shm segment or sandbox mount left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
