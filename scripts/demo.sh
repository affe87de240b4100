#!/usr/bin/env bash
# Set up the machine, then continue the example pop prompt with the shipped pop model.
# Writes MIDI, a piano roll, and a WAV when FluidSynth is present, under out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
musegen=("$py" -m musegen)

if [ -f checkpoints/pop/model.safetensors ]; then
  "${musegen[@]}" sample --checkpoint checkpoints/pop --prompt checkpoints/prompts/pop_progression.mid \
    --bars 16 --num-samples 2 --seed 1 --audio --pianoroll --out out/demo
  echo "To try prompts in a web page and hear the notes as they are drawn: $py -m musegen studio"
else
  # No trained model shipped yet: prepare the embedded corpus and show a tokenised example.
  "${musegen[@]}" data prepare chorales --out out/demo/chorales
  "${musegen[@]}" data show checkpoints/prompts/pop_progression.mid --max-tokens 48
fi
