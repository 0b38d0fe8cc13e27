"""Checkpoint conversion: `python cli/convert_ckpt.py --load-model-type hf --save-model-type mg
--load-dir HF_DIR --save-dir MCORE_DIR [--target-tensor-parallel-size N ...]` (see --help)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindrl.checkpoint.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
