# Shared by the experiment scripts: resumable training runs, two at a time by default.
# Each training process gets one thread: on a small CPU two single-threaded runs side by side
# finish sooner than two runs fighting over every core.
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
musegen=("$py" -m musegen)
JOBS=${JOBS:-2}

# train_run RUN_DIR DATA_DIR SETTING... : train (or resume) a run; nothing to do when it has a
# checkpoint at its last step or later (a run trained in phases passes its earlier targets).
# With INIT set, a new run starts from that checkpoint's weights (fine-tuning, `train --init`);
# a resumed one keeps passing it, since its model is INIT's, not a preset's.
train_run() {
  local run=$1 data=$2; shift 2
  local steps latest
  steps=$(printf '%s\n' "$@" | sed -n 's/^steps=//p' | tail -1)
  latest=$(latest_checkpoint "$run" 2>/dev/null) || true  # none yet: a failed pipeline, not a stop (set -e)
  if [ -n "$steps" ] && [ -n "$latest" ] && [ $((10#${latest##*step-})) -ge "$steps" ]; then
    echo "$run: already trained to step $steps"; return 0
  fi
  local start=()
  [ -n "${INIT:-}" ] && start=(--init "$INIT")
  compgen -G "$run/checkpoints/step-*" >/dev/null && start+=(--resume)
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  mkdir -p "$run"
  OMP_NUM_THREADS=1 "${musegen[@]}" train --data "$data" --out "$run" "${sets[@]}" "${start[@]}" > "$run/train.out" 2>&1 \
    && echo "$run: trained" || { echo "$run: FAILED (see $run/train.out)"; return 1; }
}

# fine_tune RUN INIT DATA STOP KEPT SETTING...: train (or resume) RUN from INIT's weights with
# these settings. With STOP, a comparison at equal compute: stop once checkpoint STOP is written
# and keep it as KEPT (nothing to do when KEPT exists); the run's schedule may go on longer, so it
# can be resumed. STOP empty: train to the last step.
fine_tune() {
  local run=$1 init=$2 data=$3 stop=$4 kept=$5; shift 5
  [ -n "$stop" ] && [ -d "$kept" ] && { echo "$kept: done"; return 0; }
  local sets=(--init "$init")
  compgen -G "$run/checkpoints/step-*" >/dev/null && sets+=(--resume)  # with --init: the model is the init checkpoint's, not a preset's
  for s in "$@"; do sets+=(--set "$s"); done
  mkdir -p "$run"
  OMP_NUM_THREADS=1 "${musegen[@]}" train --data "$data" --out "$run" "${sets[@]}" >> "$run/train.out" 2>&1 &
  local pid=$!
  [ -n "$stop" ] || { wait $pid; return; }
  local step=$run/checkpoints/step-$(printf %08d "$stop")
  until [ -f "$step/model.safetensors" ] || ! kill -0 $pid 2>/dev/null; do sleep 10; done
  sleep 20  # the checkpoint's last files
  kill $pid 2>/dev/null || true
  wait $pid || true
  [ -f "$step/model.safetensors" ] || { echo "$run: stopped before step $stop (see $run/train.out)"; return 1; }
  cp -r "$step" "$kept"
}

# in_pool COMMAND...: run in the background, at most $JOBS at once; `wait` collects them.
in_pool() {
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  "$@" &
}

# latest_checkpoint RUN_DIR: the newest step folder of a run.
latest_checkpoint() { ls -d "$1"/checkpoints/step-* | sort | tail -1; }

# train_models: every model of $MODELS on $DATA with the shared $COMMON settings and its own
# $MODEL_SETTINGS, into $RUNS/<model>.
train_models() {
  for m in $MODELS; do
    # shellcheck disable=SC2086
    in_pool train_run "$RUNS/$m" "$DATA" "${COMMON[@]}" ${MODEL_SETTINGS[$m]}
  done
  wait
}

# evaluate_models SPLIT MAX_LEN: NLL per position of each model's last checkpoint, into $RUNS/<model>/eval.
evaluate_models() {
  for m in $MODELS; do
    in_pool env OMP_NUM_THREADS=1 "${musegen[@]}" evaluate loss --checkpoint "$(latest_checkpoint "$RUNS/$m")" \
      --data "$DATA" --split "$1" --max-len "$2" --out "$RUNS/$m/eval"
  done
  wait
}

# continue_models SPLIT OPTION...: `evaluate continuation` of each model's last checkpoint on the
# $DATA split (seed 0, one thread each) with these options, into $RUNS/<model>/continuation.
continue_models() {
  local split=$1; shift
  for m in $MODELS; do
    in_pool "${musegen[@]}" evaluate continuation --checkpoint "$(latest_checkpoint "$RUNS/$m")" --data "$DATA" \
      --split "$split" --seed 0 --threads 1 "$@" --out "$RUNS/$m/continuation"
  done
  wait
}
