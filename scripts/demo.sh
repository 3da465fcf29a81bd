#!/usr/bin/env bash
# The main job on the embedded default model, offline: what `make demo` runs (after scripts/setup.sh).
# Today it prepares the embedded SmolLM2-135M-Instruct (converted once into the cache) and lets it answer a chat
# prompt greedily; stages are added here as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PASTA_VENV:-.venv}/bin/python
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}

echo "== prepare the embedded model (converted once, then cached)"
"$python" -m pasta.models prepare
echo "== greedy answer from the embedded model"
"$python" -m pasta.models complete --prompt "Give me three tips for staying healthy." --max-new-tokens 64
