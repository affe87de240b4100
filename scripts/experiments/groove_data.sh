#!/usr/bin/env bash
# Does more data help the shipped groove Performer, at equal compute? (issue #28; results in
# docs/experiments/groove-data/README.md). Two fine-tuning runs of checkpoints/groove-dur, side by
# side, one CPU thread each, on the same schedule (300 updates of 8 x 1,024 tokens, lr 5e-5 after
# 20 warm-up updates, cosine decay, bf16):
#   x1    the corpus it was trained on (data/mma-groove-dur: 4 pieces a style + 2,000 loops)
#   x10   the 10x corpus (data/mma-groove-dur-x10: 40 pieces a style, the further 36 variants)
# Both are scored on the 1x corpus's test split (the same unseen-style pieces as every table of
# the issue): test NLL, the copy test with the shipped model beside them, and issue #28's
# continuation protocol (60 pieces x 2).
#   bash scripts/experiments/groove_data.sh            # data train eval
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs/ft}
SHIPPED=checkpoints/groove-dur
TEST=data/mma-groove-dur
declare -A DATA_OF=([x1]=$TEST [x10]=data/mma-groove-dur-x10)
COMMON=(seq_len=1024 batch_size=8 steps=300 lr=5e-5 warmup=20 precision=bf16 workers=0 seed=1 log_every=10
        valid_every=0 ckpt_every=100 keep=1)
stages=${*:-data train eval}

for stage in $stages; do
  case $stage in
    data)  # resumes; the first 4 pieces of every style are the 1x corpus's own, so they are linked
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --loops 2000 --out "$TEST"
      if [ ! -d "${DATA_OF[x10]}/rendered" ]; then
        mkdir -p "${DATA_OF[x10]}" && cp -al "$TEST"/{rendered,g2g,loops} "${DATA_OF[x10]}/"
      fi
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --loops 2000 --scale 10 --out "${DATA_OF[x10]}" ;;
    train)
      for name in x1 x10; do INIT=$SHIPPED in_pool train_run "$RUNS/$name" "${DATA_OF[$name]}" "${COMMON[@]}"; done
      wait ;;
    eval)
      copy=(--checkpoint "shipped=$SHIPPED")
      for name in x1 x10; do
        ckpt=$(latest_checkpoint "$RUNS/$name")
        copy+=(--checkpoint "$name=$ckpt")
        OMP_NUM_THREADS=1 "${musegen[@]}" evaluate loss --checkpoint "$ckpt" --data "$TEST" --split test \
          --max-len 512 --out "$RUNS/loss-$name"
        DATA=$TEST PIECES=60 bash scripts/experiments/groove_eval.sh "$ckpt" "$RUNS/eval-$name" mma
      done
      OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy "${copy[@]}" --data "$TEST" --pieces 12 --threads 1 \
        --device cpu --out "$RUNS/copy" ;;
    *) echo "groove_data.sh: unknown stage $stage (data train eval)" >&2; exit 2 ;;
  esac
done
