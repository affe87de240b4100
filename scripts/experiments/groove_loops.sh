#!/usr/bin/env bash
# Does a Performer with SPE learn to copy a groove from random loops? (issue #28; results in
# docs/experiments/groove-loops/README.md). Every run starts from checkpoints/groove-dur and
# fine-tunes it on the schedule of the long run (7,000 updates of 8 x 512, lr 2e-4, 100 warm-up
# updates, cosine decay), one CPU thread each; the comparison runs stop at update 1,000 of that
# schedule, so they are at equal compute with the long run's own checkpoint 1,000:
#   plain           the MMA corpus as it was (groove-dur tokens)
#   loops           the same plus 2,000 random loops (data prepare mma-groove --loops 2000)
#   softmax-loops   loops, with the same weights read by exact softmax attention: the upper bound
#   f256-loops      loops, with FAVOR+ drawing 256 random features instead of 64
# The long run (stage `long`) is `loops` on a schedule of LONG_STEPS (3,000) updates; the shipped
# checkpoints/groove-dur is that run, whose schedule was shortened on the way (its card).
#   bash scripts/experiments/groove_loops.sh data train copy    # the comparison
#   bash scripts/experiments/groove_loops.sh long               # the long run (resumes)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs}
COMPARE_AT=1000
LONG_STEPS=${LONG_STEPS:-3000}
COMMON=(seq_len=512 batch_size=8 steps=7000 lr=2e-4 warmup=100 model.spe_sines=8 model.redraw=every:40
        valid_every=0 ckpt_every=250 keep=3 workers=0 seed=1)
declare -A DATA_OF=([plain]=data/mma-groove-dur-plain [loops]=data/mma-groove-dur [softmax-loops]=data/mma-groove-dur
                    [f256-loops]=data/mma-groove-dur)
declare -A INIT_OF=([plain]=checkpoints/groove-dur [loops]=checkpoints/groove-dur
                    [softmax-loops]=$RUNS/groove-dur-softmax-init [f256-loops]=$RUNS/groove-dur-f256-init)
stages=${*:-data train copy}

# loop_run NAME [STOP_AT]: fine-tune run NAME from its starting weights (common.sh's fine_tune);
# with STOP_AT, kept at that update as $RUNS/NAME-at-STOP_AT.
loop_run() {
  local stop=${2:-}
  fine_tune "$RUNS/groove-dur-$1" "${INIT_OF[$1]}" "${DATA_OF[$1]}" "$stop" "$RUNS/$1-at-$stop" "${COMMON[@]}"
}

for stage in $stages; do
  case $stage in
    data)
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --loops 2000 --out data/mma-groove-dur
      mkdir -p data/mma-groove-dur-plain  # the same renderings, without the loops
      cp -al data/mma-groove-dur/g2g data/mma-groove-dur/rendered data/mma-groove-dur-plain/ 2>/dev/null || true
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --out data/mma-groove-dur-plain ;;
    train)
      "$py" scripts/experiments/attention_view.py checkpoints/groove-dur "$RUNS/groove-dur-softmax-init" attention=softmax
      "$py" scripts/experiments/attention_view.py checkpoints/groove-dur "$RUNS/groove-dur-f256-init" n_features=256
      for m in plain loops softmax-loops f256-loops; do in_pool loop_run "$m" $COMPARE_AT; done
      wait ;;
    copy)
      OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy --checkpoint previous=checkpoints/groove \
        --checkpoint groove-dur=checkpoints/groove-dur --checkpoint "plain=$RUNS/plain-at-$COMPARE_AT" \
        --checkpoint "loops=$RUNS/loops-at-$COMPARE_AT" --checkpoint "softmax-loops=$RUNS/softmax-loops-at-$COMPARE_AT" \
        --checkpoint "f256-loops=$RUNS/f256-loops-at-$COMPARE_AT" \
        --data data/mma-groove-dur --pieces 12 --samples 2 --seed 0 --threads 1 --device cpu --out "$RUNS/groove-loops-copy" ;;
    long)
      COMMON+=(steps=$LONG_STEPS)  # (the later setting wins)
      loop_run loops ;;
    *) echo "groove_loops.sh: unknown stage $stage (data train copy long)" >&2; exit 2 ;;
  esac
done
