"""Offline DPO (stage dpo), MindSpeed-RL's `cli/train_dpo.py`:
`python cli/train_dpo.py --config-name NAME [--dry-run] [key=value ...]`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindrl.trainer.entry import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(stage="dpo"))
