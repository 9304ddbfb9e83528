"""The kinds of main_ppo failure named from its log (stare_verl.jobs.failure)."""

import pytest

from stare_verl.jobs.failure import diagnose

pytestmark = pytest.mark.unit

RAY_OOM = """\
(raylet) node_manager.cc:3517: 4 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed
ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunnerV1.run() (pid=7889, ip=192.0.2.2)
  File "/x/stare_verl/cpu/hf_rollout.py", line 111, in update_weights
ray.exceptions.OutOfMemoryError: 4 worker(s) were killed due to the node running low on memory. Memory on the node \
(IP: 192.0.2.2, ID: 2b7b) was 23.27GB used / 23.54GB limit (0.988575)
Ray killed 4 worker(s) based on the killing policy
Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_ray_memory_monitor_kill_names_workers_and_usage():
    d = diagnose(RAY_OOM, 1)
    assert d.kind == "out_of_memory" and d.resumable
    assert "Ray killed 4 worker(s) at 23.27 of 23.54 GB" in d.message
    assert "ppo_micro_batch_size_per_gpu" in d.message


def test_ray_oom_without_the_usage_line():
    d = diagnose("(raylet) 2 Workers (tasks / actors) killed due to memory pressure (OOM)\nValueError: x\n", 1)
    assert d.kind == "out_of_memory" and "Ray killed workers." in d.message


def test_torch_out_of_memory_in_a_worker():
    log = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79 GiB)\n"
    d = diagnose(log, 1)
    assert d.kind == "out_of_memory" and "Tried to allocate 2.00 GiB" in d.message


@pytest.mark.parametrize("line, expected", [
    ("Could not override 'algorithm.stare.reweight_w'.\nTo append to your config use +algorithm...",
     "Could not override 'algorithm.stare.reweight_w'."),
    ("omegaconf.errors.ConfigAttributeError: Key 'lr_x' is not in struct\n    full_key: actor.lr_x",
     "Key 'lr_x' is not in struct"),
    ("hydra.errors.OverrideParseException: mismatched input '=' expecting <EOF>", "mismatched input '='"),
])  # fmt: skip
def test_configuration_errors_are_not_resumable(line, expected):
    d = diagnose(f"some output\n{line}\nSet the environment variable HYDRA_FULL_ERROR=1\n", 1)
    assert d.kind == "config" and not d.resumable
    assert expected in d.message


def test_disk_full():
    d = diagnose("Saving checkpoint\nOSError: [Errno 28] No space left on device: '/runs/x/checkpoints'\n", 1)
    assert d.kind == "disk_full" and d.resumable


def test_a_dead_node():
    log = ("ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: 5a1f\n"
           "ray.exceptions.NodeDiedError: node 5a1f0c2d99 has been marked dead\n")  # fmt: skip
    assert diagnose(log, 1).kind == "node_died"


def test_an_actor_killed_with_sigkill_and_a_bare_sigkill():
    d = diagnose("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n", -9)
    assert d.kind == "actor_died" and "SIGKILL" in d.message
    d = diagnose("step 3\nKilled\n", 137)
    assert d.kind == "killed" and "out-of-memory killer" in d.message


def test_the_last_python_exception_otherwise():
    log = ("warnings.warn(f'engine is not available: {e!r}')  ModuleNotFoundError(\"No module named 'x'\")\n"
           "Traceback (most recent call last):\nKeyError: 'a'\nDuring handling...\n"
           "ValueError: response_mask has 3 rows, advantages 4\n")  # fmt: skip
    d = diagnose(log, 1)
    assert d.kind == "exception" and d.message == "ValueError: response_mask has 3 rows, advantages 4"


def test_nothing_known_gives_none():
    assert diagnose("step 1 done\nstep 2 done\n", 1) is None
    assert diagnose("", None) is None


# main_ppo's ray.init() on a loaded 2-core machine (a cluster test beside two training runs, load ~30)
RAY_START_TIMEOUT = """\
2026-12-06 10:27:09,623	INFO node.py:438 -- Failed to get node info b'GCS cannot find the node with node ID \
68452577d935f24f89c27217394c3bbddf71b1c1cd529c827056fea3. The node registration may not be complete yet before the \
timeout. Try increase the RAY_raylet_start_wait_time_s config.'
Error executing job with overrides: ['actor_rollout_ref.model.path=/tmp/m', 'trainer.n_gpus_per_node=2']
Traceback (most recent call last):
  File "/x/ray/_private/node.py", line 440, in __init__
    raise Exception(
Exception: The current node timed out during startup. This could happen because some of the raylet failed to \
startup or the GCS has become overloaded.
Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


@pytest.mark.parametrize("log", [
    RAY_START_TIMEOUT,
    RAY_START_TIMEOUT.split("Error executing")[0],  # only Ray's INFO line made it into the tail
    "Exception: The current node timed out during startup. This could happen because some of the raylet failed\n",
    "ConnectionError: Failed to connect to GCS within 60 seconds. GCS may have been killed.\n",
])  # fmt: skip
def test_ray_that_does_not_start_in_time_is_named_with_its_remedy(log):
    d = diagnose(log, 1)
    assert d is not None and d.kind == "ray_start" and d.resumable
    assert d.message.startswith("Ray did not start: its node did not register with its GCS in time")
    assert "RAY_raylet_start_wait_time_s" in d.message
