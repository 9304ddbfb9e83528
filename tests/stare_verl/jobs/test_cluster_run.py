"""The CPU pipeline on a two-node Ray cluster on this host (``make test-cluster``; marker ``cluster``).

Each node is its own ``ray start`` process with 16 logical CPUs and one logical GPU (a trainer rank), so verl's
resource pool of ``trainer.nnodes=2`` x ``n_gpus_per_node=1`` puts one FSDP rank, and with it one ``hf`` rollout
replica, on each node. The tool-use job (STARE, the sandboxed tool) runs 2 steps, then resumes on a fresh cluster for
a third; where verl put its workers is read from Ray's state. A second case kills a node in the middle of a run: the
run must end with an error and keep a checkpoint that a fresh cluster resumes from. A third puts both trainer ranks
on the head and both ``hf`` rollout servers on the other node (``engine_kwargs.hf.resources``), with the weights
synced across the nodes through Ray.

Several verl launches: about 10-20 minutes on 2 busy cores.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from stare_verl.jobs.cluster import LocalCluster
from stare_verl.jobs.procs import RUN_TAG_ENV, leftover_processes
from stare_verl.jobs.runlog import RunFolder
from stare_verl.jobs.train import main

pytestmark = pytest.mark.cluster

ACTORS = """
import json, ray
ray.init(address=%r, logging_level="ERROR")
print(json.dumps([{"cls": a["ActorClassName"], "name": a.get("Name") or "", "node": a["Address"]["NodeID"],
                   "state": a["State"]} for a in ray._private.state.actors().values()]))
"""


# two trainer ranks share each step's 64 sequences: micro-batches of at most 32 per rank
TWO_RANKS = [f"actor_rollout_ref.{k}_micro_batch_size_per_gpu=32"
             for k in ("actor.ppo", "rollout.log_prob", "ref.log_prob")]  # fmt: skip
ON_TWO_NODES = [*TWO_RANKS, "trainer.nnodes=2"]  # one rank (a logical GPU) per node


def _actors(cluster: LocalCluster) -> list[dict]:
    """Every actor the cluster has seen (dead ones too) with the node it ran on."""
    return json.loads(cluster.driver(ACTORS % cluster.address).strip().splitlines()[-1])


def _common(tmp_path) -> list[str]:
    (tmp_path / "cache").mkdir(exist_ok=True)
    return ["--cpu", "--family", "tooluse", "--seed", "0", "--sft-steps", "40", "--sft-cache", str(tmp_path / "cache"),
            "--min-sft-accuracy", "0", "--n-eval", "4", "--n-train", "32", "--sft-threads", "1"]  # fmt: skip


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def tagged(monkeypatch):
    tag = f"pytest-cluster-{os.getpid()}"
    monkeypatch.setenv(RUN_TAG_ENV, tag)
    yield tag
    assert leftover_processes(f"{tag}-", prefix=True, grace_s=20.0) == []


def test_tooluse_run_spans_two_nodes_and_resumes_on_a_fresh_cluster(tmp_path, monkeypatch, capsys, tagged):
    run = tmp_path / "run"
    common = [*_common(tmp_path), "--run-dir", str(run)]
    with LocalCluster(n_nodes=2) as cluster:
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        assert main([*common, "--steps", "2", *ON_TWO_NODES]) == 0
        actors = _actors(cluster)
        node_ids = {n.node_id for n in cluster.nodes}
        assert len(node_ids) == 2 and None not in node_ids
        # verl's trainer ranks (its colocated worker-group actors) and the hf servers, one of each per node
        ranks = {a["node"] for a in actors if "WorkerDict" in a["cls"]}
        servers = {a["node"] for a in actors if (a["name"] or "").startswith("hf_server")}
        assert ranks == node_ids, actors
        assert servers == node_ids, actors
    assert cluster.stop() == []
    assert leftover_processes(cluster.tag) == []

    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["entropy_control/target_entropy"] == 0.04 and r["entropy_control/model_tokens"] > 0
        assert 0 <= r["critic/score/mean"] <= 1 and r["num_turns/mean"] >= 1
    assert (run / "checkpoints" / "global_step_2" / "stare_state.json").exists()
    assert (run / "plots" / "dashboard.png").exists() and (run / "summary.json").exists()

    capsys.readouterr()
    with LocalCluster(n_nodes=2) as cluster:  # a fresh cluster: the run resumes from its folder
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        assert main([*common, "--steps", "3", *ON_TWO_NODES]) == 0
    assert cluster.stop() == []
    assert f"resuming from the checkpoint of step 2 in {run / 'checkpoints'}" in capsys.readouterr().out
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2, 3]
    state = json.loads((run / "checkpoints" / "global_step_3" / "stare_state.json").read_text())
    assert state["steps"] == 3

    # the same seed on one node with two ranks: the same arithmetic, so the same stare/* metrics and rewards
    monkeypatch.delenv("RAY_ADDRESS")
    single = tmp_path / "single"
    ref = [*_common(tmp_path), "--run-dir", str(single), "--steps", "2", *TWO_RANKS, "trainer.n_gpus_per_node=2",
           "ray_kwargs.ray_init.num_gpus=2"]  # fmt: skip
    assert main(ref) == 0
    one = _rows(single / "metrics.jsonl")
    for a, b in zip(rows, one, strict=True):
        keys = [k for k in a if k.startswith(("stare/", "entropy_control/"))] + ["critic/score/mean", "reward/acc/mean"]
        assert keys and {k: b[k] for k in keys} == pytest.approx({k: a[k] for k in keys}, rel=1e-5, abs=1e-6)


def test_a_node_killed_mid_run_ends_it_with_an_error_and_a_resumable_checkpoint(tmp_path, monkeypatch, capsys,
                                                                                 tagged):  # fmt: skip
    run = tmp_path / "run"
    common = [*_common(tmp_path), "--run-dir", str(run), "--save-freq", "1"]
    monkeypatch.setenv("STARE_STALL_TIMEOUT_S", "600")
    killed = threading.Event()
    with LocalCluster(n_nodes=2) as cluster:
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)

        def kill_after_first_checkpoint():
            deadline = time.monotonic() + 1500
            while time.monotonic() < deadline:
                if (RunFolder(run).latest_step() or 0) >= 1:  # verl writes its tracker file last
                    time.sleep(1.0)
                    cluster.kill_node(1)
                    killed.set()
                    return
                time.sleep(0.5)

        killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
        killer.start()
        t0 = time.monotonic()
        rc = main([*common, "--steps", "4", *ON_TWO_NODES])
        took = time.monotonic() - t0
        killer.join(timeout=5)
    assert cluster.stop() == []
    assert killed.is_set()
    assert rc != 0, "a run that lost a node must not report success"
    err = capsys.readouterr().err
    # verl's error (a dead actor) or the stall watch's stop, each with where the run resumes from
    assert "verl main_ppo exited with" in err or "stopped: no progress" in err, err[-3000:]
    if "verl main_ppo exited with" in err:  # Ray's error for the lost actor, named as the cluster's
        assert f"error: the run lost a process on the Ray cluster at {cluster.address}" in err
    assert took < 1500
    latest = RunFolder(run).latest_step()
    assert latest is not None and 1 <= latest < 4, latest  # the checkpoint before the kill, not the end

    capsys.readouterr()
    with LocalCluster(n_nodes=2) as cluster:  # a fresh cluster resumes from it
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        assert main([*common, "--steps", str(latest + 1), *ON_TWO_NODES]) == 0
    assert cluster.stop() == []
    assert f"resuming from the checkpoint of step {latest} in {run / 'checkpoints'}" in capsys.readouterr().out
    assert (run / "checkpoints" / f"global_step_{latest + 1}" / "stare_state.json").exists()


SYNC_LINE = re.compile(r"hf rollout replica (\d+): weights of step (\d+) \((\d+) tensors loaded so far, "
                       r"fingerprint ([-+0-9.eE]+|nan|inf)\)")  # fmt: skip


def test_actor_on_one_node_and_rollout_replicas_on_the_other(tmp_path, monkeypatch, tagged):
    """Two trainer ranks on node 0 (the only node with devices), the two hf servers on node 1 (they ask for its
    ``stare_node_1`` resource): 2 STARE steps, the weights synced to the other node after every update."""
    run = tmp_path / "run"
    args = [*_common(tmp_path), "--run-dir", str(run), "--steps", "2", *TWO_RANKS, "trainer.nnodes=1",
            "trainer.n_gpus_per_node=2", "+actor_rollout_ref.rollout.engine_kwargs.hf.resources={stare_node_1:0.5}",
            # an entropy bonus: every update changes the weights even when all rewards of the tiny run are 0
            # (advantages 0, weight decay 0), so the fingerprints below tell each weight version apart
            "actor_rollout_ref.actor.entropy_coeff=0.01"]  # fmt: skip
    with LocalCluster(n_nodes=2, gpus_per_node=[2, 0]) as cluster:
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        assert main(args) == 0
        actors = _actors(cluster)
        actor_node, rollout_node = (n.node_id for n in cluster.nodes)
        assert None not in (actor_node, rollout_node) and actor_node != rollout_node
        ranks = [a["node"] for a in actors if "WorkerDict" in a["cls"]]
        servers = sorted((a["name"], a["node"]) for a in actors if (a["name"] or "").startswith("hf_server"))
        assert ranks == [actor_node, actor_node], actors
        assert servers == [("hf_server_0", rollout_node), ("hf_server_1", rollout_node)], actors
    assert cluster.stop() == []
    assert leftover_processes(cluster.tag) == []

    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["entropy_control/target_entropy"] == 0.04 and r["entropy_control/model_tokens"] > 0
        assert 0 <= r["critic/score/mean"] <= 1 and r["num_turns/mean"] >= 1
        # the rollout's log-probs are the actor's (fp32 both sides): step 2 was generated on node 1 with the
        # weights that step 1's update produced on node 0
        assert r["training/rollout_probs_diff_mean"] < 1e-4, r["training/rollout_probs_diff_mean"]
    # every server reported each sync: the first before step 1, then one after each update (verl may skip the one
    # after the last step), with new weights each time
    # Both nodes of a cluster on one host share Ray's session folder, so each node's log monitor forwards every
    # worker line: a server's line reaches train.log once per node, identical (a re-sync would differ in its
    # tensor count). Distinct lines are the syncs.
    lines = SYNC_LINE.findall(RunFolder(run).train_log.read_text(errors="replace"))
    assert lines and all(lines.count(x) in (1, 2) for x in lines), lines  # at most once per node
    syncs: dict[int, list[tuple[int, int, float]]] = {}
    for replica, step, loaded, fp in dict.fromkeys(lines):
        syncs.setdefault(int(replica), []).append((int(step), int(loaded), float(fp)))
    assert sorted(syncs) == [0, 1], syncs
    for replica, seen in syncs.items():
        assert len(seen) in (2, 3), (replica, seen)
        steps, loaded, fps = zip(*seen, strict=True)
        assert list(steps) == sorted(set(steps)), seen  # one sync per weight version, in order
        assert loaded[0] > 0 and list(loaded) == [loaded[0] * (i + 1) for i in range(len(seen))], seen
        assert len(set(fps)) == len(seen), seen  # each update changed what the server serves
    assert syncs[0] == syncs[1]  # both replicas serve the same weights after each sync
