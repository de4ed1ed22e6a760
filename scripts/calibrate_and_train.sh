#!/usr/bin/env bash
# Calibrate, then train with the plan: a recipe for any machine (a workstation, a cloud VM, one node).
#
#   bash scripts/calibrate_and_train.sh TRAIN_SCRIPT [-- SCRIPT_ARGS...]
#
# 1. `autobatch tune` finds every combination's largest micro-batch on this machine's device (one GPU of
#    each model it has, or the CPU), chooses, plans accumulation for NPROC processes and writes
#    $OUT/autobatch.env (and the result). A second run with nothing changed is served from the cache
#    in under a second, so this can run before every training run.
# 2. The training command starts with those variables exported: AUTOBATCH_MICRO_BATCH_SIZE,
#    AUTOBATCH_ACCUMULATION_STEPS, AUTOBATCH_PRECISION, AUTOBATCH_OPTIMIZER, ... (see autobatch/emit/env.py);
#    the training script reads them (examples/mlp.py does).
#
# Environment (all optional):
#   GLOBAL_BATCH  the global batch to plan for (unset: the chosen micro-batch, no accumulation)
#   NPROC         training processes, one per GPU (default: the visible GPUs, else 1)
#   OUT           folder of what autobatch writes (default: autobatch-out)
#   AUTOBATCH     how to run autobatch (default: autobatch)
#   PYTHON        the interpreter that trains (default: python3)
#   TRAIN         the training command, instead of `torchrun --standalone --nproc-per-node NPROC`
#                 (NPROC > 1) or `$PYTHON` (NPROC = 1); TRAIN_SCRIPT and SCRIPT_ARGS are appended
#   AUTOBATCH_*   any autobatch setting: AUTOBATCH_DEVICE, AUTOBATCH_MEMORY, AUTOBATCH_PRECISIONS,
#                 AUTOBATCH_CACHE_DIR, ... (README, Configuration), or an autobatch.toml here
set -euo pipefail

script=${1:?usage: calibrate_and_train.sh TRAIN_SCRIPT [-- SCRIPT_ARGS...]}
shift
if [ "${1:-}" = "--" ]; then shift; fi
AUTOBATCH=${AUTOBATCH:-autobatch}
PYTHON=${PYTHON:-python3}
out=${OUT:-autobatch-out}
mkdir -p "$out"

if [ -z "${NPROC:-}" ]; then
  NPROC=$($AUTOBATCH devices --json -q | "$PYTHON" -c \
    'import json, sys; print(max(1, sum(1 for g in json.load(sys.stdin)["gpus"] for d in [g, *g["mig"]] if d["index"] is not None)))')
fi

# 1. Calibrate (instant when the script, its settings and the device are unchanged).
$AUTOBATCH tune "$script" --world-size "$NPROC" ${GLOBAL_BATCH:+--global-batch-size "$GLOBAL_BATCH"} \
  --output "$out/autobatch-result.json" --emit env="$out/autobatch.env" -- "$@"

# 2. Train with the plan.
set -a
# shellcheck disable=SC1091
. "$out/autobatch.env"
set +a
echo "training: micro-batch $AUTOBATCH_MICRO_BATCH_SIZE x accumulation $AUTOBATCH_ACCUMULATION_STEPS x $NPROC process(es), $AUTOBATCH_PRECISION, $AUTOBATCH_OPTIMIZER" >&2
if [ -n "${TRAIN:-}" ]; then
  # shellcheck disable=SC2086
  exec $TRAIN "$script" "$@"
elif [ "$NPROC" -gt 1 ]; then
  exec torchrun --standalone --nproc-per-node "$NPROC" "$script" "$@"
else
  exec "$PYTHON" "$script" "$@"
fi
