#!/usr/bin/env bash
# Run the trainer on every worker of a Cloud TPU VM pod slice (JAX finds its peers itself).
#   launch/tpu_pod.sh [--dry-run] TPU_NAME ZONE [CONFIG[:function]] [--set key=value ...]
# REPO_DIR: the checkout on the workers (default ~/orchestrax, expanded on each worker).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
set -- "${ARGS[@]}"
TPU=${1:?tpu name}; ZONE=${2:?zone}; CONFIG=${3:-configs/qwen3_tpu.py}; shift 3 || shift $#
split_sets "$@"
# Quoted so that ~ reaches the remote shell unexpanded (a local ~ is this machine's home).
REPO=${REPO_DIR:-'~/orchestrax'}
CMD="cd $REPO && pip install -q -e '.[tpu]' && python -m orchestrax.cli train --config $(printf '%q' "$CONFIG")"
for s in "${SETS[@]}"; do CMD+=" $(printf '%q' "$s")"; done
run gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "$CMD"
