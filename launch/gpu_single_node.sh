#!/usr/bin/env bash
# One 8-GPU node: SGLang rollout servers on ROLLOUT_GPUS, the JAX trainer on TRAIN_GPUS.
#   launch/gpu_single_node.sh [--dry-run] [CONFIG] [--set key=value ...]
# CONFIG defaults to configs/qwen3_8b_gpu.py (edit HF_PATH there). The config's server URLs must
# match the ports started here (30000, 30001, ...).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
set -- "${ARGS[@]}"
CONFIG=${1:-configs/qwen3_8b_gpu.py}; shift || true
ROLLOUT_GPUS=${ROLLOUT_GPUS:-0,1,2,3}
TRAIN_GPUS=${TRAIN_GPUS:-4,5,6,7}
MODEL=$(python -c "import runpy; print(runpy.run_path('$CONFIG')['config']().hf_path)")
PIDS=()
trap 'kill ${PIDS[@]:-} 2>/dev/null || true' EXIT
if [ "$(python -c "import runpy; print(runpy.run_path('$CONFIG')['config']().rollout.backend)")" = sglang ]; then
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  run_bg bash "$(dirname "$0")/sglang_fleet.sh" "${dry[@]}" "$MODEL" 1 "$ROLLOUT_GPUS" 30000
  [ "$DRY_RUN" = 1 ] || { sleep 5; for p in 30000 30001 30002 30003; do wait_healthy "http://127.0.0.1:$p"; done; }
fi
run env CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
  python -m orchestrax.cli train --config "$CONFIG" "$@"
