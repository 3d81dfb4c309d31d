#!/usr/bin/env bash
# One 8-GPU node: one SGLang server per URL of the config's rollout.server_urls (their ports), on
# ROLLOUT_GPUS in order, then the JAX trainer on TRAIN_GPUS.
#   launch/gpu_single_node.sh [--dry-run] [CONFIG[:function]] [--set key=value ...]
# CONFIG defaults to configs/qwen3_8b_gpu.py. An embedded-sampler config starts no servers.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
set -- "${ARGS[@]}"
CONFIG=${1:-configs/qwen3_8b_gpu.py}; shift || true
split_sets "$@"
ROLLOUT_GPUS=${ROLLOUT_GPUS:-0,1,2,3}
TRAIN_GPUS=${TRAIN_GPUS:-4,5,6,7}
{ read -r BACKEND; read -r MODEL; read -r URLS; } < <(config_value rollout.backend hf_path rollout.server_urls)
PIDS=()
trap 'kill ${PIDS[@]:-} 2>/dev/null || true' EXIT
if [ "$BACKEND" = sglang ]; then
  read -ra URL_ARR <<<"$URLS"
  IFS=, read -ra GPU_ARR <<<"$ROLLOUT_GPUS"
  if [ ${#GPU_ARR[@]} -lt ${#URL_ARR[@]} ]; then
    echo "rollout.server_urls names ${#URL_ARR[@]} servers but ROLLOUT_GPUS=$ROLLOUT_GPUS has ${#GPU_ARR[@]} GPUs" >&2
    exit 2
  fi
  PORTS=$(for u in "${URL_ARR[@]}"; do url_port "$u"; done | paste -sd,)
  GPUS=$(IFS=,; echo "${GPU_ARR[*]:0:${#URL_ARR[@]}}")
  if [ "$DRY_RUN" = 1 ]; then  # the fleet's own commands, as it would run them
    bash "$LAUNCH_DIR/sglang_fleet.sh" --dry-run "$MODEL" 1 "$GPUS" "$PORTS"
  else
    run_bg bash "$LAUNCH_DIR/sglang_fleet.sh" "$MODEL" 1 "$GPUS" "$PORTS"
  fi
  for u in "${URL_ARR[@]}"; do wait_healthy "$u"; done
fi
run env CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
  "$PYTHON" -m orchestrax.cli train --config "$CONFIG" "${SETS[@]}"
