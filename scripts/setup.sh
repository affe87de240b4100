#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for musegen: system packages, Python packages, and the
# studio page's in-browser synthesiser (npm).
#   bash scripts/setup.sh          runtime + dev tools
#   bash scripts/setup.sh --fast   also build the optional fast-transformers kernels (~9 min on CPU)
# PYTHON=/path/to/python selects the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."

with_fast=0
for arg in "$@"; do
  case "$arg" in
    --fast) with_fast=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# System packages: FluidSynth + a General MIDI soundfont (audio), MMA (groove corpus synthesis),
# Chromium and its WebDriver (the studio's browser test drives the page in headless Chromium),
# Freedoom (its WADs' music is the `freedoom` corpus, a test set of real multi-track songs).
# npm (Node.js) installs the studio page's synthesiser; Debian's is taken only where none is on PATH.
apt_packages=(fluidsynth fluid-soundfont-gm mma chromium chromium-driver freedoom)
command -v npm >/dev/null 2>&1 || apt_packages+=(nodejs npm)
if ! dpkg -s "${apt_packages[@]}" >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
pip=("$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore)

# torch first: a CPU build unless the machine has an NVIDIA GPU (an unpinned torch pulls CUDA).
if ! "$py" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    "${pip[@]}" torch==2.13.0 || "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

"${pip[@]}" -e ".[dev]"

# The studio page's General MIDI synthesiser, at the versions package-lock.json pins, into
# node_modules/, which the studio serves (musegen/studio/sound.py). `npm ci` replaces whatever is
# there, so a second run ends in the same state.
npm ci --no-audit --no-fund --loglevel=error

if [ "$with_fast" = 1 ] && ! "$py" -c "import fast_transformers.causal_product" 2>/dev/null; then
  # Its setup.py imports torch (hence no build isolation) and fails when it finds nvcc without
  # CUDA_HOME, so nvcc is hidden from PATH unless CUDA_HOME is set.
  build_path=$PATH
  if [ -z "${CUDA_HOME:-}" ]; then
    build_path=$(printf '%s' "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd:)
  fi
  echo "Building pytorch-fast-transformers 0.4.0 (several minutes)..."
  PATH=$build_path MAX_JOBS=${MAX_JOBS:-2} "${pip[@]}" --no-build-isolation pytorch-fast-transformers==0.4.0
fi
