"""Check a machine or cluster before a run: `python cli/doctor.py [--config-name NAME] [--quick] [--json PATH]`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindrl.doctor.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
