# stare-verl: every target installs what it needs on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stare-installed
# On a machine without an NVIDIA GPU pin the CPU torch wheel before anything can pull a CUDA build.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-deps test bench lint data data-hf train-tooluse train-shortcot train-longcot sft-tooluse compare eval clean

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

# bubblewrap is the preferred sandbox backend for the Python tool.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }

test: install system-deps
	$(BIN)/python -m pytest -q tests

bench: install system-deps
	@set -e; for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f; done

# Offline reasoning-gym sets for every family (no network).
data: install
	$(BIN)/python -m envs.datasets offline --out data
	$(BIN)/python -m envs.tool_use.task offline --out data

# The Hugging Face sets the GPU recipes train and validate on (needs network or a local HF cache).
data-hf: install system-deps
	@set -e; for fam in short_cot long_cot; do for n in dapo_math aime2024 aime2025 math500; do \
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
# trainer on the hf backend); on a GPU node with `pip install -e '.[gpu]'`: verl + SGLang with the recipe.
# MODEL=... (GPU), RUN_DIR=..., ARGS="--steps 40 --seed 1 --method grpo", OVERRIDES="hydra.key=value ...".
train-tooluse: install system-deps
	$(BIN)/python -m stare_verl.jobs.train --family tooluse $(ARGS) $(OVERRIDES)

train-shortcot: install
	$(BIN)/python -m stare_verl.jobs.train --family shortcot $(ARGS) $(OVERRIDES)

train-longcot: install
	$(BIN)/python -m stare_verl.jobs.train --family longcot $(ARGS) $(OVERRIDES)

# Cold-start SFT of the tool-use model: verl's SFT trainer (torchrun) on a GPU node, with
# recipes/sft/tooluse_qwen2.5-7b.yaml on data/sft/ (make data-hf writes it); MODEL=<base model, default
# Qwen/Qwen2.5-7B> ARGS="--nproc 8" OVERRIDES="optim.lr=2e-5 ...". Without a GPU: the tiny model's cached CPU SFT.
sft-tooluse: install system-deps
	$(BIN)/python -m stare_verl.jobs.sft train $(if $(MODEL),--model $(MODEL)) $(ARGS) $(OVERRIDES)

# STARE vs GRPO-ds on a CPU default task: 3 seeds each from one SFT checkpoint (runs/compare/, or
# runs/compare-<family>/ with FAMILY=shortcot|longcot).
compare: install system-deps
	$(BIN)/python -m stare_verl.jobs.compare $(if $(FAMILY),--family $(FAMILY)) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
