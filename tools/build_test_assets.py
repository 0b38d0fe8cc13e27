"""Build the offline test assets (tiny models, SmolLM2-135M-Instruct) into the cache folder.

Run once before the test suite (or let the fixtures build on first use):
    python tools/build_test_assets.py --what all [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

# The tiny variants the test fixtures use (tests/conftest.py) beside the `${asset:...}` tiny
# models (`mindrl.assets.models.TINY_ASSETS`); built here so a CI job can warm the cache in one
# step.
TINY_VARIANTS: dict[str, dict] = {
    "tiny_llama": {"family": "llama"},
    "tiny_qwen2_odd_vocab": {"vocab_size": 509},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="cache folder (sets MINDRL_ASSETS_DIR)")
    parser.add_argument("--what", choices=("tiny", "smollm2", "all"), default="all")
    args = parser.parse_args(argv)
    if args.out is not None:
        os.environ["MINDRL_ASSETS_DIR"] = str(args.out.resolve())

    if importlib.util.find_spec("mindrl") is None:  # run from a checkout, not installed
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    start = time.perf_counter()
    import torch  # noqa: F401  (timed apart from the builds)
    import transformers  # noqa: F401

    from mindrl.assets import cache, models, smollm2

    print(f"assets root: {cache.assets_root()}")
    print(f"imports: {time.perf_counter() - start:.1f} s")
    if args.what in ("tiny", "all"):
        builders = {
            **models.TINY_ASSETS,
            **{
                name: functools.partial(models.tiny_model_dir, **variant)
                for name, variant in TINY_VARIANTS.items()
            },
        }
        for name, build in builders.items():
            start = time.perf_counter()
            folder = build()
            print(f"{name}: {folder} ({time.perf_counter() - start:.2f} s)")
    if args.what in ("smollm2", "all"):
        start = time.perf_counter()
        try:
            folder = smollm2.smollm2_dir()
        except ModuleNotFoundError as err:
            print(f"smollm2: not built: {err}", file=sys.stderr)
            return 1
        print(f"smollm2: {folder} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
