#!/usr/bin/env bash
# What a local exact window (`model.window = W`: exact softmax over the last W tokens, FAVOR+ over
# the older ones, one normalisation) and positions in beats (`model.positions = beats`) do to the
# shipped groove model. Results in docs/experiments/groove-window/README.md. One CPU thread per job;
# the fine-tunes in fp32 on every machine (the first ones ran on a CPU without bf16).
#   views     checkpoints/groove-dur's weights read with windows of WINDOWS tokens and with exact
#             softmax over everything, untrained (scripts/experiments/attention_view.py)
#   zero      recall gain and copy test (the sampler's defaults) of the views; and the issue-style
#             continuation protocol with --cache 0 on the Freedoom tunes of tests/data/multitrack
#   data      the MMA corpus in groove-dur tokens, its test styles whole (--limit 640 renders every
#             test style and a few train and validation ones), plus 2,000 random loops
#   finetune  two fine-tuning runs from checkpoints/groove-dur at equal compute, side by side:
#             `plain` (as trained) and `window-256` (the same weights with window 256), 8 x 512
#             tokens an update, lr 1e-4, 20 warm-up updates, cosine over 400; compared at STOP
#   beats     the same for `beats` (positions in musical time: model.positions=beats) and
#             `beats-window-256` (both), from the same weights
#   softmax   `softmax`: the same weights read with exact softmax over every token (the view of `views`),
#             fine-tuned alike: the upper bound a window tends to, at the same compute
#   bar       `beats-bar`: the `beats` start with heads 0 and 1 of sineSPE turning at 1/4..4/4 cycles a
#             beat, a kernel that peaks once a bar (scripts/experiments/bar_kernel.py), fine-tuned alike
#             (the page's run: STOP=100, compared with `beats` at its update 100)
#   compare   recall gain and the copy test with the model alone (--cache 0, corpus patterns) of
#             the start and every run of FINE_TUNED at STOP
#   styles    the issue-style continuation protocol on the 60 test-style pieces (2-bar prompts,
#             8 bars, 2 samples, --cache 0) for the same models
#   midi      the same models on the Freedoom tunes of tests/data/multitrack, --cache 0
#   bash scripts/experiments/groove_window.sh views zero data finetune beats softmax bar compare styles midi
# Settings (environment): RUNS (runs), WINDOWS ("128 256 512"), STOP (150; the page also has 100),
# FINE_TUNED (the runs compare, styles and midi take: "plain window-256 beats beats-window-256
# softmax beats-bar").
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs}
WINDOWS=${WINDOWS:-128 256 512}
STOP=${STOP:-150}
BASE=checkpoints/groove-dur
DATA=$RUNS/data/mma-groove-dur
OUT=$RUNS/groove-window
stages=${*:-views zero}

views=(trained=$BASE softmax=$OUT/view-softmax)
for w in $WINDOWS; do views+=(window-$w=$OUT/view-window-$w); done

# The fine-tuned runs and their starting weights; `beats` reads each token's position as its onset
# in beats, 16 positions a beat (the corpus's median tokens per beat is 15.8, so the kernels learnt
# over token positions keep about their reach).
declare -A INIT_OF=([plain]=$BASE [window-256]=$OUT/view-window-256 [beats]=$OUT/view-beats
                    [beats-window-256]=$OUT/view-beats-window-256 [beats-bar]=$OUT/view-beats-bar
                    [softmax]=$OUT/view-softmax)
BEATS=(positions=beats positions_per_beat=16)
FINE_TUNE=(seq_len=512 batch_size=8 steps=400 lr=1e-4 warmup=20 model.redraw=every:40 valid_every=0
           ckpt_every=50 keep=20 workers=0 seed=1 precision=fp32)

# tuned NAME: fine-tune NAME from its starting weights, kept at update STOP as $OUT/NAME-at-STOP.
tuned() { fine_tune "$OUT/ft-$1" "${INIT_OF[$1]}" "$DATA" "$STOP" "$OUT/$1-at-$STOP" "${FINE_TUNE[@]}"; }

# kept_runs: start=BASE and NAME=its kept checkpoint for every fine-tuned run of FINE_TUNED.
kept_runs() {
  echo "start=$BASE"
  for m in $FINE_TUNED; do echo "$m=$OUT/$m-at-$STOP"; done
}
FINE_TUNED=${FINE_TUNED:-plain window-256 beats beats-window-256 softmax beats-bar}

for stage in $stages; do
  case $stage in
    views)
      mkdir -p "$OUT"
      [ -d "$OUT/view-softmax" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-softmax" attention=softmax
      for w in $WINDOWS; do
        [ -d "$OUT/view-window-$w" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-window-$w" window="$w"
      done ;;
    zero)
      models=()
      for v in "${views[@]}"; do models+=(--checkpoint "$v"); done
      [ -f "$OUT/copy/copy.json" ] || OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy "${models[@]}" \
        --threads 1 --device cpu --out "$OUT/copy"
      for v in "${views[@]}"; do
        in_pool env SAMPLING="--cache 0" bash scripts/experiments/groove_eval.sh "${v#*=}" "$OUT/${v%%=*}" midi table
      done
      wait ;;
    data)
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --limit 640 --loops 2000 --out "$DATA" ;;
    finetune)
      in_pool tuned plain
      in_pool tuned window-256
      wait ;;
    beats)
      [ -d "$OUT/view-beats" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-beats" "${BEATS[@]}"
      [ -d "$OUT/view-beats-window-256" ] || "$py" scripts/experiments/attention_view.py $BASE \
        "$OUT/view-beats-window-256" "${BEATS[@]}" window=256
      in_pool tuned beats
      in_pool tuned beats-window-256
      wait ;;
    softmax)
      [ -d "$OUT/view-softmax" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-softmax" attention=softmax
      tuned softmax ;;
    bar)
      [ -d "$OUT/view-beats-bar" ] || "$py" scripts/experiments/bar_kernel.py "$OUT/view-beats" "$OUT/view-beats-bar" 2 4
      tuned beats-bar ;;
    compare)
      models=()
      for m in $(kept_runs); do models+=(--checkpoint "$m"); done
      [ -f "$OUT/compare/copy.json" ] || OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy "${models[@]}" \
        --data "$DATA" --cache 0 --threads 1 --device cpu --out "$OUT/compare" ;;
    styles)
      for m in $(kept_runs); do
        in_pool env DATA="$DATA" PIECES=60 SAMPLES=2 SAMPLING="--cache 0" \
          bash scripts/experiments/groove_eval.sh "${m#*=}" "$OUT/mma-${m%%=*}" mma table
      done
      wait ;;
    midi)
      for m in $(kept_runs); do
        in_pool env SAMPLING="--cache 0" bash scripts/experiments/groove_eval.sh "${m#*=}" "$OUT/midi-${m%%=*}" midi table
      done
      wait ;;
    *) echo "groove_window.sh: unknown stage $stage (views zero data finetune beats softmax bar compare styles midi)" >&2; exit 2 ;;
  esac
done
