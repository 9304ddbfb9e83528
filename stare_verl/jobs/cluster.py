"""verl runs on a multi-node Ray cluster: a local cluster of several Ray nodes on one host (the cluster test), the
``main_ppo`` overrides that connect a run to an existing cluster, and the commands a real cluster runs on its head
and worker nodes (``stare-verl train --gpu --nnodes N --dry-run``).

How verl spreads a run over nodes: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` trainer ranks, one Ray placement
group per node (``STRICT_PACK`` bundles of one device each, ``verl.single_controller.ray.base.RayResourcePool``), so a
node must advertise ``n_gpus_per_node`` devices (Ray's ``GPU`` resource; on the CPU backend a logical one per rank).
The ``hf`` rollout's server actors follow the first rank of their replica (``stare_verl.cpu.hf_rollout``), so with
one rank per replica every node that holds a rank also serves rollouts; with ``engine_kwargs.hf.resources`` they go
wherever Ray finds those resources instead (rollout nodes apart from the actor's; weights still synced over Ray).

A run joins a cluster when ``RAY_ADDRESS`` is set (Ray's own variable, as ``ray job submit`` and ``ray start`` use
it): the recipe's local ``ray_init`` settings (``num_cpus``, ``num_gpus``, the dashboard switch), which Ray refuses
when it connects to a running cluster, are dropped, and the run's own environment variables travel as the job's
``runtime_env`` (a worker node's raylet does not have them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from stare_verl.jobs.procs import RUN_TAG_ENV, cpu_env, kill_tagged

RAY_ADDRESS_ENV = "RAY_ADDRESS"
LOCAL_RAY_INIT_KEYS = ("num_cpus", "num_gpus", "include_dashboard")
"""``ray_kwargs.ray_init`` keys of the CPU recipes that only a fresh local Ray takes (``ray.init`` raises on them
when it connects to an existing cluster)."""
RUNTIME_ENV_VARS = (
    "VERL_PLATFORM", "VERL_FILE_LOGGER_PATH", RUN_TAG_ENV, "PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED", "VERL_USE_EXTERNAL_MODULES", "STARE_CACHE_DIR", "HF_HOME",
    "VERL_ENGINE_DEVICE", "VERL_ENGINE_VENDOR",
)  # fmt: skip
"""Environment variables of a run that its Ray workers need and that a worker node's raylet lacks; they travel in
the job's ``runtime_env`` when the run joins a cluster (only those set)."""


def cluster_overrides(env: dict[str, str], keys: tuple[str, ...] = RUNTIME_ENV_VARS) -> list[str]:
    """The Hydra overrides that make ``main_ppo`` join the Ray cluster at ``env["RAY_ADDRESS"]``: the recipe's
    local-only ``ray_init`` keys removed, the address set, and the variables ``keys`` that ``env`` sets passed as
    ``ray_kwargs.ray_init.runtime_env.env_vars``. ``[]`` when ``RAY_ADDRESS`` is unset or empty (a fresh local Ray,
    as on one machine). ``++`` sets a key whether or not the recipe has it. Values are quoted for Hydra (a path with ``,`` or ``=`` stays one value)."""
    address = env.get(RAY_ADDRESS_ENV, "").strip()
    if not address:
        return []
    out = [f"++ray_kwargs.ray_init.{k}=null" for k in LOCAL_RAY_INIT_KEYS]  # null: ray.init's default
    out.append(f"++ray_kwargs.ray_init.address={_hydra_str(address)}")
    for k in keys:
        if env.get(k):
            out.append(f"++ray_kwargs.ray_init.runtime_env.env_vars.{k}={_hydra_str(env[k])}")
    return out


def _hydra_str(value: str) -> str:
    """``value`` as a quoted Hydra string (single quotes, backslash-escaped quotes and backslashes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def strip_local_ray_keys(overrides: list[str]) -> list[str]:
    """``overrides`` without any that set a local-only ``ray_init`` key (:data:`LOCAL_RAY_INIT_KEYS`), which would
    clash with their removal by :func:`cluster_overrides`."""
    bad = tuple(f"{p}ray_kwargs.ray_init.{k}=" for k in LOCAL_RAY_INIT_KEYS for p in ("", "+", "++"))
    return [o for o in overrides if not o.startswith(bad)]


def join_cluster(cmd: list[str], env: dict[str, str]) -> list[str]:
    """``cmd`` (a ``main_ppo`` command line) made to join the cluster at ``env["RAY_ADDRESS"]``
    (:func:`cluster_overrides` appended, conflicting local keys dropped); ``cmd`` unchanged without it."""
    extra = cluster_overrides(env)
    if not extra:
        return list(cmd)
    return strip_local_ray_keys(list(cmd)) + extra


LOST_ACTOR = re.compile(
    r"ActorUnavailableError|ActorDiedError|RayActorError|NodeDiedError|OwnerDiedError|The actor died unexpectedly"
)
"""What Ray raises in main_ppo when a process of the run went away with its node (or the node's connection)."""


def lost_node_message(log_text: str, env: dict[str, str]) -> str | None:
    """The line a failed run on a cluster (``RAY_ADDRESS`` in ``env``) prints when ``log_text`` (the end of its
    ``train.log``) shows that Ray lost one of its actors, which on a cluster means a node died or was cut off;
    None otherwise (no cluster, or another error)."""
    address = env.get(RAY_ADDRESS_ENV, "").strip()
    m = LOST_ACTOR.search(log_text) if address else None
    if m is None:
        return None
    return (f"error: the run lost a process on the Ray cluster at {address} ({m.group(0)}): a node died or was cut "
            "off. Bring the cluster back (ray status lists its nodes); the same command then resumes from the last "
            "checkpoint")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# a local cluster: several Ray nodes on this host


@dataclass
class LocalNode:
    """One node of a :class:`LocalCluster`: its ``ray start --block`` process (own session) and resources."""

    index: int
    proc: subprocess.Popen
    num_cpus: int
    num_gpus: int
    label: str
    node_id: str | None = None


@dataclass
class LocalCluster:
    """A Ray cluster of ``n_nodes`` nodes on this host, each its own ``ray start --block`` process with ``num_cpus``
    logical CPUs, ``num_gpus`` devices (Ray's ``GPU`` resource: verl places one trainer rank per device; node
    ``i`` has ``gpus_per_node[i]`` instead when that list is given, e.g. ``[2, 0]``: trainer ranks on the head
    only) and a custom resource ``stare_node_<i>: 1`` that names it. Every process of the cluster carries the run tag
    ``tag`` (``STARE_VERL_RUN_TAG``), so :meth:`stop` ends all of them, workers included, and nothing of them
    is left.

    Use as a context manager; :attr:`address` is the head's GCS address (``RAY_ADDRESS`` for a run).
    Raises RuntimeError when a node does not come up within ``start_timeout_s``."""

    n_nodes: int = 2
    num_cpus: int = 16
    num_gpus: int = 1
    gpus_per_node: list[int] | None = None
    env: dict[str, str] | None = None
    object_store_mb: int = 200
    start_timeout_s: float = 300.0
    tag: str = field(default_factory=lambda: f"cluster-{uuid.uuid4().hex[:12]}")
    nodes: list[LocalNode] = field(default_factory=list)
    address: str | None = None
    temp_dir: str | None = None

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        env = cpu_env(self.env)
        env[RUN_TAG_ENV] = self.tag
        env.pop(RAY_ADDRESS_ENV, None)
        env.setdefault("RAY_AUTH_MODE", "disabled")  # a cluster of this host only: its drivers need no token
        # Ray's 60 s for a node to register with the GCS is too short on a loaded 2-core host (as for a CPU run)
        from stare_verl.jobs.train.launch import RAY_START_WAIT_S

        env.setdefault("RAY_raylet_start_wait_time_s", str(RAY_START_WAIT_S))
        return env

    def start(self) -> str:
        """Start the head, then the workers, and wait until the cluster lists all nodes alive; returns the
        address."""
        if self.n_nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got n_nodes={self.n_nodes}")
        if self.gpus_per_node is not None and (len(self.gpus_per_node) != self.n_nodes
                                               or min(self.gpus_per_node) < 0):  # fmt: skip
            raise ValueError(f"gpus_per_node needs {self.n_nodes} counts >= 0, got {self.gpus_per_node}")
        # a short path: Ray's socket names live under it (Unix sockets allow ~107 characters)
        self.temp_dir = tempfile.mkdtemp(prefix="stare-ray-", dir="/tmp")
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        for i in range(self.n_nodes):
            head = i == 0
            gpus = self.num_gpus if self.gpus_per_node is None else self.gpus_per_node[i]
            args = [
                sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                *(["--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                   f"--temp-dir={self.temp_dir}"] if head else
                  [f"--address={self.address}", "--node-ip-address=127.0.0.1"]),
                f"--num-cpus={self.num_cpus}", f"--num-gpus={gpus}",
                f"--resources={json.dumps({f'stare_node_{i}': 1})}",
                f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
                "--disable-usage-stats",
            ]  # fmt: skip
            log = open(Path(self.temp_dir) / f"node{i}.log", "ab")
            proc = subprocess.Popen(args, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            log.close()
            self.nodes.append(LocalNode(i, proc, self.num_cpus, gpus, f"stare_node_{i}"))
            self._wait_nodes(i + 1)
        return self.address

    def alive_nodes(self) -> list[dict]:
        """The cluster's live nodes as Ray reports them (``ray.nodes()`` entries with ``Alive`` true), read by a
        short-lived driver process (this process keeps no Ray connection)."""
        return [n for n in self.ray_nodes() if n.get("Alive")]

    def ray_nodes(self) -> list[dict]:
        """Every node Ray knows of (``ray.nodes()``: ``NodeID``, ``Alive``, ``Resources``), read in a subprocess."""
        code = "import json, ray; ray.init(address=%r, logging_level='ERROR'); print(json.dumps(ray.nodes()))"
        out = self.driver(code % self.address)
        return json.loads(out.strip().splitlines()[-1])

    def driver(self, code: str, timeout: float = 120.0) -> str:
        """Run ``code`` as a Python driver attached to nothing (it calls ``ray.init(address=...)`` itself) with the
        cluster's environment; returns its stdout. Raises RuntimeError with its output when it fails."""
        res = subprocess.run([sys.executable, "-c", code], env=self._env(), capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"ray driver failed ({res.returncode}): {res.stderr[-2000:]}")
        return res.stdout

    def _wait_nodes(self, n: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"Ray node {node.index} exited with {node.proc.returncode}: "
                                       f"{self.node_log(node.index)[-2000:]}")  # fmt: skip
            try:
                alive = self.alive_nodes()
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
                last = str(e)
                time.sleep(1.0)
                continue
            if len(alive) >= n:
                for node in self.nodes:
                    for info in alive:
                        if info["Resources"].get(node.label):
                            node.node_id = info["NodeID"]
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster did not list {n} nodes in {self.start_timeout_s:.0f} s ({last[-500:]})")

    def node_log(self, index: int) -> str:
        """The output of node ``index``'s ``ray start`` process."""
        try:
            return (Path(self.temp_dir) / f"node{index}.log").read_text(errors="replace")
        except OSError:
            return ""

    def kill_node(self, index: int) -> None:
        """Kill node ``index`` at once (SIGKILL to its ``ray start`` session: raylet, object store, its workers), as
        a machine that fails; the other nodes keep running."""
        node = self.nodes[index]
        pids = _session_pids(node.proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.proc.wait(timeout=30)

    def stop(self) -> list[int]:
        """Stop every node (workers first, the head last) and every process carrying the cluster's tag, then remove
        the cluster's temporary folder (its nodes' logs and Ray's session); returns the PIDs still alive after that
        (normally none; the folder is then kept). Safe to call twice."""
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                try:
                    os.killpg(node.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for node in reversed(self.nodes):
            try:
                node.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(node.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                node.proc.wait(timeout=10)
        left = kill_tagged(self.tag)
        if not left and self.temp_dir:  # the session folders (logs, sockets) go with the cluster
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def _session_pids(sid: int) -> list[int]:
    """PIDs of the live processes in session ``sid`` (what one ``ray start`` node started)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 4 and int(fields[3]) == sid and fields[0] != "Z":  # state ppid pgrp session
            out.append(int(entry))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------------
# a real cluster: what to run on each node


@dataclass(frozen=True)
class ClusterPlan:
    """The commands of a multi-node run: ``head`` (on the first node), ``worker`` (on each other node), ``submit``
    (on any machine that reaches the head's dashboard: the run as a Ray job) and ``direct`` (on the head: the
    driver itself), plus ``notes`` (what every node needs)."""

    head: list[str]
    worker: list[str]
    submit: list[str]
    direct: list[str]
    notes: list[str]

    def lines(self, nnodes: int) -> list[str]:
        """The plan as printable lines (commands shell-quoted, ``$HEAD_IP`` left for the shell to expand)."""
        q = shell_join
        out = [f"multi-node run on {nnodes} nodes (trainer.nnodes={nnodes}); HEAD_IP: the head node's address",
               "  on the head node:", f"    {q(self.head)}"]  # fmt: skip
        if nnodes > 1:
            out += [f"  on each of the {nnodes - 1} worker node(s), once the head is up:", f"    {q(self.worker)}"]
        out += ["  then the run, either as a Ray job (from any machine that reaches the head's dashboard):",
                f"    {q(self.submit)}", "  or as a driver on the head node:", f"    {q(self.direct)}"]  # fmt: skip
        out += [f"  note: {n}" for n in self.notes]
        return out


def shell_join(argv: list[str]) -> str:
    """``argv`` as one shell command line: each argument quoted as :func:`shlex.join` does, except that one made of
    shell-safe characters and ``$HEAD_IP`` stays bare, so the shell expands the variable."""
    out = []
    for a in argv:
        bare = a.replace("$HEAD_IP", "HEAD_IP")
        out.append(a if "$HEAD_IP" in a and shlex.quote(bare) == bare else shlex.quote(a))
    return " ".join(out)


def cluster_plan(main_cmd: list[str], driver: list[str], nnodes: int, n_gpus: int, env: dict[str, str],
                 sandbox_note: str, head: str = "$HEAD_IP", port: int = 6379,
                 dashboard_port: int = 8265) -> ClusterPlan:  # fmt: skip
    """The plan of a run of ``main_cmd`` (``python -m verl.trainer.main_ppo ...`` with its overrides) on ``nnodes``
    nodes of ``n_gpus`` GPUs each: ``ray start`` for the head and the workers, ``ray job submit`` of ``main_cmd``
    with the ``runtime_env`` the project needs (``env``'s variables among :data:`RUNTIME_ENV_VARS` but the per-run
    ones, the working directory left to the nodes' installs), and ``driver`` (the ``stare-verl train`` command
    line, which keeps the run folder) with ``RAY_ADDRESS``. ``sandbox_note``: what each node needs for the tool
    sandbox (empty for a family without a tool). Raises ValueError for ``nnodes`` or ``n_gpus`` below 1."""
    if nnodes < 1 or n_gpus < 1:
        raise ValueError(f"nnodes and n_gpus must be >= 1, got {nnodes} and {n_gpus}")
    head_cmd = ["ray", "start", "--head", f"--port={port}", f"--num-gpus={n_gpus}", "--dashboard-host=0.0.0.0",
                f"--dashboard-port={dashboard_port}"]  # fmt: skip
    worker_cmd = ["ray", "start", f"--address={head}:{port}", f"--num-gpus={n_gpus}"]
    is_main_ppo = main_cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    entry = ["python", "-m", "verl.trainer.main_ppo", *main_cmd[3:]] if is_main_ppo else list(main_cmd)
    per_run = ("PYTHONPATH", RUN_TAG_ENV, "VERL_FILE_LOGGER_PATH")
    runtime_env = {"env_vars": {k: env[k] for k in RUNTIME_ENV_VARS if env.get(k) and k not in per_run}}
    submit = ["ray", "job", "submit", f"--address=http://{head}:{dashboard_port}",
              f"--runtime-env-json={json.dumps(runtime_env, sort_keys=True)}", "--", *entry]  # fmt: skip
    direct = ["env", f"RAY_ADDRESS={head}:{port}", *driver]
    notes = [
        "every node needs the same install (pip install -e '.[gpu]' of this project at the same path, so the "
        "recipes, data and model paths in the command resolve on every node) and the same data/ and model files",
        f"every node advertises {n_gpus} GPU(s): verl puts {n_gpus} trainer rank(s) on each of the {nnodes} nodes "
        "(one Ray placement group per node) and the rollout replicas beside them",
        "as a driver on the head (RAY_ADDRESS set), stare-verl train writes the run folder (metrics.jsonl, plots, "
        "dashboard, summary) on the head; a submitted job writes checkpoints under trainer.default_local_dir, "
        "which must be a path every node shares (NFS) for resume",
    ]
    if sandbox_note:
        notes.append(sandbox_note)
    return ClusterPlan(head_cmd, worker_cmd, submit, direct, notes)


DRIVER_OPTIONS = (("family", "--family"), ("method", "--method"), ("gpu_recipe", "--gpu-recipe"),
                  ("seed", "--seed"), ("steps", "--steps"), ("save_freq", "--save-freq"), ("n_gpus", "--n-gpus"),
                  ("nnodes", "--nnodes"), ("logger", "--logger"), ("run_dir", "--run-dir"), ("model", "--model"))  # fmt: skip
"""The ``stare-verl train`` options a GPU run takes, as ``(attribute, flag)``."""


def driver_argv(args, defaults) -> list[str]:
    """The ``stare-verl train --gpu`` command line of ``args`` (a parsed ``stare-verl train`` namespace): the GPU
    options of :data:`DRIVER_OPTIONS` that differ from ``defaults`` (the parser's), ``--family`` and ``--model`` (when
    given) always, then the
    Hydra overrides; ``--dry-run`` left out."""
    out = ["stare-verl", "train", "--gpu"]
    for attr, flag in DRIVER_OPTIONS:
        value = getattr(args, attr, None)
        if value is None or (attr not in ("family", "model") and value == getattr(defaults, attr, None)):
            continue
        out += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return out + list(getattr(args, "overrides", []) or [])


def sandbox_note(has_tool: bool) -> str:
    """What each node needs for the tool sandbox (the agent-loop workers that run the tool land on any node):
    bubblewrap (``make system-deps``) or a SandboxFusion server's URL; empty without a tool."""
    if not has_tool:
        return ""
    return ("the tool runs model-written code on whichever node holds an agent-loop worker: every node needs "
            "bubblewrap (make system-deps; the sandbox interpreter from make sandbox-python) or the tool config's "
            "SandboxFusion URL reachable from every node (a restricted subprocess is the last fallback)")


__all__ = [
    "DRIVER_OPTIONS",
    "shell_join",
    "driver_argv",
    "sandbox_note",
    "ClusterPlan",
    "LOCAL_RAY_INIT_KEYS",
    "LocalCluster",
    "RAY_ADDRESS_ENV",
    "RUNTIME_ENV_VARS",
    "cluster_overrides",
    "cluster_plan",
    "join_cluster",
    "lost_node_message",
    "strip_local_ray_keys",
]
