#!/usr/bin/env bash
# One lent GPU command (the `device` tool, issue #28): train two groove models side by side on
# one GPU within a fixed wall-clock budget, and hand back their fp16 weights.
#   spe       Performer + gated sineSPE (K=8, features redrawn every 40 updates): the paper's family
#   softmax   the same model read by exact softmax attention (SDPA): the upper bound
# Both are 8 layers x 384 (14.5M parameters, 27.7 MiB in fp16): the two together fill the 64 MiB
# that may come back from the machine. Same data (groove-dur tokens with 2,000 random loops),
# batch, schedule and number of updates.
#
# The number of updates is what fits the budget: a 30-update probe of both runs side by side
# times an update, and the real runs get the rest of BUDGET_S less a margin for export. A watchdog
# stops a run that would overrun (SIGTERM saves its checkpoint). Outputs under OUT:
#   <name>.safetensors.part-*   fp16 weights in pieces of 15 MiB (the machine returns files up to 16)
#   meta.tar.gz                 configs, tokenizer, logs of the runs and the probe, CUDA test log
# Here: cat <name>.safetensors.part-* > model.safetensors beside the config and tokenizer.
#
# On the device:  OUT=$OUT bash scripts/experiments/gpu_groove.sh   (with .whl and data/gpu-groove carried)
#   the next run: DATA=data/gpu-groove-x10 KIT_SHUFFLE=0.5 (the 10x corpus, half the pieces on a shuffled kit)
#   .whl: the wheels of musegen's needs that the machine's image lacks (miditoolkit, mido, pydantic,
#   pydantic-core, symusic, pySmartDL, platformdirs, typing-inspection, annotated-types,
#   typing-extensions), for its Python 3.12; data/gpu-groove: index.json, tokenizer.json and the
#   shards of a prepared corpus, each .npy as it is or packed as .npy.xz (token streams of looped
#   grooves shrink about 13x: the 10x corpus's 104.6 MB training shard packs into 8.1 MB, the
#   whole folder into 12 MB), unpacked on the machine. Packing the 10x corpus
#   (`data prepare mma-groove --tokenizer groove-dur --scale 10 --loops 2000`), here:
#     mkdir data/gpu-groove-x10 && cp data/mma-groove-dur-x10/{index,tokenizer}.json data/gpu-groove-x10/
#     for f in data/mma-groove-dur-x10/*.npy; do xz -T2 -c "$f" > data/gpu-groove-x10/$(basename "$f").xz; done
#   The tree that travels is limited to 64 MiB; the tracked tree is about 58 MB, 52 of them the
#   shipped checkpoints: move checkpoints/groove-dur-softmax and checkpoints/groove out of the tree
#   for the call (with .whl and the packed corpus it is then about 46 MB), and put them back after.
# Dry run on CPU: DRY=1 OUT=/tmp/gpu-out bash scripts/experiments/gpu_groove.sh
# Issue #42's runs (positions in beats, a local exact window; docs/experiments/groove-musical-time):
#   RUNS="spe beats window beats-window" DTYPE=int8 THREADS=3 WORKERS=2 BUDGET_S=490 (four int8 models
#   of 14.1 MiB come back where two fp16 ones did; the image lacks pretty_midi and importlib_resources
#   too, so .whl holds them beside the wheels named above). Next: RUNS="finish beats-window ape-window":
#   the shipped model trained on, beside SPE and APE at the new setup from random weights with one
#   schedule (claim 2's comparison). Checked on the CPU with DRY=1 RUNS="finish ape-window".
#   BASS_DOUBLING=0.5 doubles the bass of half the pieces in every run (a CPU fine-tune with it:
#   docs/experiments/groove-musical-time, "Where the bass goes missing"); checked with DRY=1 too.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
BUDGET_S=${BUDGET_S:-470}  # from the start until both runs must have stopped
OUT=${OUT:?set OUT}
DATA=${DATA:-data/gpu-groove}
WORK=${WORK:-/tmp/gpu-groove}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$WORK/script.log") 2>&1

# A packed corpus is unpacked into WORK: the carried folder stays as it came.
if compgen -G "$DATA/*.npy.xz" >/dev/null; then
  mkdir -p "$WORK/data" && cp "$DATA"/*.json "$WORK/data/" || exit 1
  python3 - "$DATA" "$WORK/data" <<'EOF' || { echo "unpacking $DATA failed"; exit 1; }
import lzma, shutil, sys
from pathlib import Path
for packed in Path(sys.argv[1]).glob("*.npy.xz"):
    with lzma.open(packed) as src, open(Path(sys.argv[2]) / packed.stem, "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
  DATA=$WORK/data
fi

if [ -z "${DRY:-}" ] && [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheels failed to install"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
py=python3
$py -c "import torch, musegen.cli; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
nvidia-smi -L 2>/dev/null || true

MODEL=(model.vocab_size=439 model.n_layers=8 model.d_model=384 model.n_heads=6 model.d_ff=1536 model.n_features=128
       model.spe_realizations=64 model.spe_sines=8 model.gated=true model.redraw=every:40)
KIT_SHUFFLE=${KIT_SHUFFLE:-0}  # 0.5: half the pieces on a shuffled drum kit (docs/experiments/groove-data, "Longer, and with a shuffled drum kit")
BASS_DOUBLING=${BASS_DOUBLING:-0}  # 0.5: half the pieces with their bass doubled (docs/experiments/groove-musical-time)
COMMON=(seq_len=1024 batch_size=32 lr=3e-4 warmup=200 precision=bf16 workers=${WORKERS:-3} seed=1 log_every=10
        kit_shuffle=$KIT_SHUFFLE bass_doubling=$BASS_DOUBLING)
device=cuda
THREADS=${THREADS:-4}  # per process: two runs and the tests stay within the machine's 16 cores (3 for four runs)
if [ -n "${DRY:-}" ]; then  # the same path at toy size on the CPU
  MODEL=(model.vocab_size=439 model.n_layers=2 model.d_model=64 model.n_heads=2 model.d_ff=128 model.n_features=16
         model.spe_realizations=16 model.spe_sines=8 model.gated=true model.redraw=every:40)
  COMMON=(seq_len=128 batch_size=2 lr=3e-4 warmup=20 precision=fp32 workers=0 seed=1 log_every=5 kit_shuffle=$KIT_SHUFFLE
          bass_doubling=$BASS_DOUBLING)
  device=cpu
  THREADS=1
fi
# The runs that can be asked for (RUNS, default "spe softmax"); issue #42's mechanisms are
# positions in beats (16 units a beat: a bar is 64 units, about its length in tokens) and an exact
# window of WINDOW tokens beside FAVOR+.
WINDOW=${WINDOW:-256}
BEATS="model.positions=beats model.positions_per_beat=16"
declare -A EXTRA=([spe]="model.attention=performer" [softmax]="model.attention=softmax"
                  [beats]="model.attention=performer $BEATS" [window]="model.attention=performer model.window=$WINDOW"
                  [beats-window]="model.attention=performer $BEATS model.window=$WINDOW"
                  [ape-window]="model.attention=performer model.pe=ape $BEATS model.window=$WINDOW"
                  [finish]="lr=1e-4 warmup=20 seed=3")
# A run named here starts from these weights (`--init`: a fresh optimiser, the checkpoint's model).
# finish: the shipped groove-dur, stopped at update 598 of 838 at lr 1e-4, on from there down to 0,
# with the window it is read with now (512; trained with 256 until then).
declare -A INIT=([finish]=checkpoints/groove-dur)
NAMES=${RUNS:-spe softmax}
for name in $NAMES; do [ -n "${EXTRA[$name]:-}" ] || { echo "unknown run $name"; exit 1; }; done
DTYPE=${DTYPE:-fp16}  # int8 for four runs: four fp16 models would not fit the 64 MiB that come back

# launch NAME RUN STEPS SETTING...: one training run in the background; its pid in PIDS[NAME].
declare -A PIDS
launch() {
  local name=$1 run=$2 steps=$3; shift 3
  local sets=() init=() model=("${MODEL[@]}")
  # the model of an --init run is its checkpoint's (EXTRA may repeat it, not contradict it)
  [ -n "${INIT[$name]:-}" ] && init=(--init "${INIT[$name]}") && model=()
  for s in "${model[@]}" "${COMMON[@]}" ${EXTRA[$name]} "steps=$steps" "$@"; do sets+=(--set "$s"); done
  OMP_NUM_THREADS=$THREADS $py -m musegen train --data "$DATA" --out "$run" --device $device "${init[@]}" "${sets[@]}" > "$run.out" 2>&1 &
  PIDS[$name]=$!
}

# seconds_per_update LOG: from the log's update records, steps 10 to the last.
seconds_per_update() {
  $py - "$1" <<'EOF'
import sys
from pathlib import Path
from musegen.evaluation.compare import read_jsonl  # the log's records, checked against its schema
from musegen.training.run_folder import LOG_RECORD
rows = [r for r in read_jsonl(Path(sys.argv[1]), LOG_RECORD) if "loss" in r and "time" in r and r["step"] >= 10]
print((rows[-1]["time"] - rows[0]["time"]) / (rows[-1]["step"] - rows[0]["step"]))
EOF
}

# The CUDA tests, beside the runs (they are small).
if [ -z "${DRY:-}" ]; then
  (OMP_NUM_THREADS=$THREADS timeout 240 $py -m pytest -q -p no:cacheprovider -x tests/test_device.py tests/test_numerics.py \
     tests/test_transformer.py tests/test_attention.py tests/test_spe.py tests/test_precision.py > "$WORK/cuda-tests.log" 2>&1;
   echo "pytest exit $?" >> "$WORK/cuda-tests.log") &
  tests_pid=$!
fi

echo "== probe (30 updates each, side by side)"
for name in $NAMES; do launch "$name" "$WORK/probe-$name" 30 valid_every=0 ckpt_every=30; done
# A run whose probe fails is left out (its log comes back): the others still use the machine.
ok=""
for name in $NAMES; do
  if wait "${PIDS[$name]}"; then ok="$ok $name"; else echo "probe $name failed:"; tail -20 "$WORK/probe-$name.out"; fi
done
NAMES=$ok
[ -n "$NAMES" ] || exit 1
slowest=0
for name in $NAMES; do
  s=$(seconds_per_update "$WORK/probe-$name/log.jsonl"); echo "$name: $s s/update"
  slowest=$($py -c "print(max($slowest, $s))")
done
left=$(( BUDGET_S - ($(date +%s) - start) - 25 ))  # 25 s: the runs' start-up and last checkpoint
steps=$($py -c "print(max(50, int($left / $slowest)))")
echo "== $steps updates each ($left s left at $slowest s/update)"
every=$(( steps / 4 ))
for name in $NAMES; do launch "$name" "$WORK/$name" "$steps" "ckpt_every=$every" "valid_every=$every" keep=1 valid_pieces=64; done

deadline=$(( start + BUDGET_S ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  running=0
  for name in $NAMES; do kill -0 "${PIDS[$name]}" 2>/dev/null && running=1; done
  [ $running = 0 ] && break
  sleep 2
done
for name in $NAMES; do kill -TERM "${PIDS[$name]}" 2>/dev/null && echo "$name: stopped at the deadline"; done
for name in $NAMES; do wait "${PIDS[$name]}"; echo "$name: exit $?"; tail -3 "$WORK/$name.out"; done

[ -n "${tests_pid:-}" ] && wait "$tests_pid"
echo "== export"
for name in $NAMES; do
  ckpt=$(ls -d "$WORK/$name"/checkpoints/step-* 2>/dev/null | sort | tail -1)
  [ -n "$ckpt" ] || { echo "$name: no checkpoint"; continue; }
  $py -m musegen export "$ckpt" --out "$WORK/export-$name" --dtype "$DTYPE" || continue
  split -b 15M "$WORK/export-$name/model.safetensors" "$OUT/$name.safetensors.part-"
  rm "$WORK/export-$name/model.safetensors"
  cp "$WORK/$name/log.jsonl" "$WORK/$name/train_config.json" "$WORK/export-$name/"
done
tar -czf "$OUT/meta.tar.gz" -C "$WORK" --exclude='*/checkpoints' --exclude='*.safetensors' \
  script.log $(cd "$WORK" && ls -d export-* probe-*/log.jsonl ./*.out cuda-tests.log 2>/dev/null)
ls -la "$OUT"
echo "done in $(( $(date +%s) - start )) s"
