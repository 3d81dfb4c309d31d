#!/usr/bin/env bash
# Start one SGLang server per GPU group (and optionally sglang-router in front of them).
#   launch/sglang_fleet.sh [--dry-run] MODEL_PATH GPUS_PER_SERVER GPU_LIST [BASE_PORT] [ROUTER_PORT]
# e.g. launch/sglang_fleet.sh /models/Qwen3-8B 1 0,1,2,3 30000 29999
set -euo pipefail
source "$(dirname "$0")/_common.sh"
set -- "${ARGS[@]}"
MODEL=${1:?model path}; TP=${2:-1}; GPUS=${3:-0}; BASE_PORT=${4:-30000}; ROUTER_PORT=${5:-}
IFS=, read -ra GPU_ARR <<<"$GPUS"
PIDS=(); URLS=()
for ((i = 0; i < ${#GPU_ARR[@]}; i += TP)); do
  group=$(IFS=,; echo "${GPU_ARR[*]:i:TP}")
  port=$((BASE_PORT + i / TP))
  run_bg env CUDA_VISIBLE_DEVICES="$group" python -m sglang.launch_server --model-path "$MODEL" \
    --tp "$TP" --port "$port" --host 0.0.0.0 --mem-fraction-static 0.85
  URLS+=("http://127.0.0.1:$port")
done
for u in "${URLS[@]}"; do wait_healthy "$u"; done
if [ -n "$ROUTER_PORT" ]; then
  run_bg python -m sglang_router.launch_router --worker-urls "${URLS[@]}" --port "$ROUTER_PORT" \
    --policy cache_aware
  wait_healthy "http://127.0.0.1:$ROUTER_PORT"
  echo "router: http://127.0.0.1:$ROUTER_PORT"
fi
echo "servers: ${URLS[*]}"
[ "$DRY_RUN" = 1 ] || wait
