"""Raw prompts -> tokenized prompt store.

    python cli/preprocess_data.py --config-name r1_zero_qwen25_7b [key=value ...]
    python cli/preprocess_data.py --config-name gsm8k_qwen25_0.5b \\
        --input data/gsm8k/train.parquet --output-prefix data/gsm8k_store seq_length=512

Reads ``configs/datasets/NAME.yaml`` (or ``--config-dir``), applies ``key=value``
overrides and the path flags, and writes the store at ``output_prefix``. Config problems
(unknown keys, bad values, handler, template, missing input or tokenizer folder, unwritable
output) are all listed at once before anything runs.
Exit status: 0 done, 1 refused by a policy (bad/overlong rows), 2 bad config or an
unusable input / output path (stderr names each problem).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from mindrl.config.errors import ConfigError  # noqa: E402
from mindrl.data.compose import load_preprocess_config  # noqa: E402
from mindrl.data.preprocess import PreprocessError, run_preprocess  # noqa: E402
from mindrl.data.readers import DataFileError  # noqa: E402
from mindrl.data.store import StoreError  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config-name", help="configs/datasets/NAME.yaml (or a YAML path)")
    parser.add_argument("--config-dir", default=str(REPO_ROOT / "configs" / "datasets"))
    parser.add_argument("--input", help="overrides `input`")
    parser.add_argument("--output-prefix", help="overrides `output_prefix`")
    parser.add_argument("--tokenizer-name-or-path", help="overrides `tokenizer_name_or_path`")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (Hydra style)")
    args = parser.parse_args(argv)
    # MindSpeed-RL's script passes the config name positionally.
    if args.config_name is None and args.overrides and "=" not in args.overrides[0]:
        args.config_name = args.overrides.pop(0)
    if args.config_name is None:
        parser.error("--config-name is required")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[preprocess] %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    flags = {
        "input": args.input,
        "output_prefix": args.output_prefix,
        "tokenizer_name_or_path": args.tokenizer_name_or_path,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    try:
        config = load_preprocess_config(
            args.config_name, args.config_dir, args.overrides, flags, check_paths=True
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_preprocess(config)
    except ConfigError as exc:  # found once the run starts (e.g. reasoning-gym names)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PreprocessError as exc:
        print(exc.report.summary(), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, DataFileError, StoreError) as exc:  # input / output / tokenizer
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
