#!/usr/bin/env bash
# The sampler's suffix cache on the shipped groove models (issue #28; results in
# docs/experiments/groove-cache/README.md). The cache (musegen/generation/cache.py) proposes what
# followed the piece's last tokens where they occurred before, mixed with the model at weight w.
# Nothing is trained; one CPU thread a job, two jobs at once.
#   nll    teacher-forced NLL of the mixture (cache_nll.py) on 60 validation and 60 test pieces
#   sweep  `evaluate continuation` of groove-dur on 60 validation pieces x 2 at each of WEIGHTS,
#          and issue #28's MMA criteria of each (the weight is chosen here, not on the test styles)
#   eval   groove_eval.sh (MMA test styles, real MIDI, copy test, done-when table) of both shipped
#          models at WEIGHT, the copy test with the previous model beside them, and the looper
#          (looper.py: the prompt's last two bars replayed) on the same pieces
#   bash scripts/experiments/groove_cache.sh               # nll sweep eval
#   WEIGHT=0.8 bash scripts/experiments/groove_cache.sh eval
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs/cache}
DATA=data/mma-groove-dur
WEIGHTS=${WEIGHTS:-0 0.5 0.7 0.8 0.9}
WEIGHT=${WEIGHT:-0.8}
MODELS=(groove-dur groove-dur-softmax)
stages=${*:-nll sweep eval}
mkdir -p "$RUNS"

# sweep_one W: the validation protocol at weight W, then its criteria table.
sweep_one() {
  local out=$RUNS/sweep-$1
  OMP_NUM_THREADS=1 "${musegen[@]}" evaluate continuation --checkpoint checkpoints/groove-dur --data "$DATA" \
    --split validation --pieces 60 --prompt-bars 2 --bars 8 --samples-per-piece 2 --seed 0 --threads 1 \
    --device cpu --cache "$1" --out "$out/mma" > "$out.log" 2>&1
  "$py" scripts/experiments/groove_targets.py --mma "$out/mma" --out "$out" >> "$out.log"
}

for stage in $stages; do
  case $stage in
    nll)
      for split in validation test; do
        in_pool env OMP_NUM_THREADS=1 "$py" scripts/experiments/cache_nll.py "$DATA" "$split" 60 \
          groove-dur=checkpoints/groove-dur groove-dur-softmax=checkpoints/groove-dur-softmax \
          > "$RUNS/nll-$split.md"
      done
      wait ;;
    sweep)
      for w in $WEIGHTS; do mkdir -p "$RUNS/sweep-$w"; in_pool sweep_one "$w"; done
      wait
      for w in $WEIGHTS; do
        met=$(grep '^| MMA test styles |' "$RUNS/sweep-$w/done_when.md" | grep -v '| pieces' | grep -c '| pass |')
        echo "w=$w: $met of 8 MMA criteria met on the validation styles"
      done ;;
    eval)
      for m in "${MODELS[@]}"; do
        in_pool env SAMPLING="--cache $WEIGHT" DATA=$DATA PIECES=60 \
          bash scripts/experiments/groove_eval.sh "checkpoints/$m" "$RUNS/$m-$WEIGHT" mma midi \
          > "$RUNS/$m-$WEIGHT.log" 2>&1
      done
      wait
      OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy --checkpoint groove-dur=checkpoints/groove-dur \
        --checkpoint groove-dur-softmax=checkpoints/groove-dur-softmax --checkpoint previous=checkpoints/groove \
        --data "$DATA" --cache "$WEIGHT" --threads 1 --device cpu --out "$RUNS/copy-$WEIGHT" > "$RUNS/copy-$WEIGHT.log"
      for m in "${MODELS[@]}"; do
        "$py" scripts/experiments/groove_targets.py --mma "$RUNS/$m-$WEIGHT/mma" --midi "$RUNS/$m-$WEIGHT/midi" \
          --copy "$RUNS/copy-$WEIGHT" --out "$RUNS/$m-$WEIGHT" > /dev/null
      done
      "$py" scripts/experiments/looper.py "$RUNS/groove-dur-$WEIGHT/mma" "$DATA" test "$RUNS/looper/mma"
      "$py" scripts/experiments/looper.py "$RUNS/groove-dur-$WEIGHT/midi" tests/data/multitrack midi "$RUNS/looper/midi"
      "$py" scripts/experiments/groove_targets.py --mma "$RUNS/looper/mma" --midi "$RUNS/looper/midi" \
        --out "$RUNS/looper" > /dev/null ;;
    *) echo "groove_cache.sh: unknown stage $stage (nll sweep eval)" >&2; exit 2 ;;
  esac
done
