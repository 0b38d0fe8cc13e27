#!/usr/bin/env bash
# Raw dataset -> tokenized prompt store, configured by configs/datasets/NAME.yaml.
#   bash examples/data/preprocess_data.sh r1_zero_qwen25_7b [key=value ...]
# Relative paths in the YAML are taken from the repository root.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT_PATH="$(cd "${SCRIPT_DIR}/../.." && pwd)"

if [[ $# -lt 1 ]]; then
    echo "usage: $0 CONFIG_NAME [key=value ...]" >&2
    echo "configs: $(cd "${PROJECT_PATH}/configs/datasets" && ls -- *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
    exit 2
fi
config="$1"
shift

cd "${PROJECT_PATH}"
python cli/preprocess_data.py --config-name "${config}" "$@"
