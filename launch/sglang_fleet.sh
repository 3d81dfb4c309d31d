#!/usr/bin/env bash
# Start one SGLang server per GPU group (and optionally sglang-router in front of them).
#   launch/sglang_fleet.sh [--dry-run] MODEL_PATH GPUS_PER_SERVER GPU_LIST PORTS [ROUTER_PORT]
# PORTS: one port per server (comma list) or the first of consecutive ones, e.g.
#   launch/sglang_fleet.sh /models/Qwen3-8B 1 0,1,2,3 30000,30001,30002,30003 29999
# Needs the sglang package on this node (pip install "sglang[all]").
set -euo pipefail
source "$(dirname "$0")/_common.sh"
set -- "${ARGS[@]}"
MODEL=${1:?model path}; TP=${2:-1}; GPUS=${3:-0}; PORTS=${4:-30000}; ROUTER_PORT=${5:-}
HOST=${SGLANG_HOST:-0.0.0.0}; MEM=${SGLANG_MEM_FRACTION:-0.85}
IFS=, read -ra GPU_ARR <<<"$GPUS"
IFS=, read -ra PORT_ARR <<<"$PORTS"
PIDS=(); URLS=()
trap '[ "$DRY_RUN" = 1 ] || kill ${PIDS[@]:-} 2>/dev/null || true' EXIT
for ((i = 0; i < ${#GPU_ARR[@]}; i += TP)); do
  group=$(IFS=,; echo "${GPU_ARR[*]:i:TP}")
  k=$((i / TP))
  if [ ${#PORT_ARR[@]} -gt 1 ]; then port=${PORT_ARR[$k]:?fewer PORTS than servers}; else port=$((PORT_ARR[0] + k)); fi
  run_bg env CUDA_VISIBLE_DEVICES="$group" "$PYTHON" -m sglang.launch_server --model-path "$MODEL" \
    --tp "$TP" --port "$port" --host "$HOST" --mem-fraction-static "$MEM"
  URLS+=("http://127.0.0.1:$port")
done
for u in "${URLS[@]}"; do wait_healthy "$u"; done
if [ -n "$ROUTER_PORT" ]; then
  run_bg "$PYTHON" -m sglang_router.launch_router --worker-urls "${URLS[@]}" --port "$ROUTER_PORT" \
    --policy cache_aware
  wait_healthy "http://127.0.0.1:$ROUTER_PORT"
  echo "router: http://127.0.0.1:$ROUTER_PORT"
fi
echo "servers: ${URLS[*]}"
[ "$DRY_RUN" = 1 ] || wait
