# Two commands on a fresh machine:  `make run`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: never an unpinned torch (CUDA wheels, GBs). Where pip does not already
	# serve CPU wheels (this project's machines do), `make run TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[dev,capture,learned,shard,search,learn]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on the embedded default data: analyze a real 8-GPU DLRM trace.
run: $(STAMP)
	$(BIN)/trainsim analyze examples/data/param_dlrm_8xv100
	$(BIN)/trainsim predict llama2-7b --system dgx-a100 --gpus 16 --tp 2 --pp 2 --micro-batch 2 --global-batch 256

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist *.egg-info
