# Sourced by the launch scripts: `run` prints the command under --dry-run, else executes it.
DRY_RUN=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--dry-run" ]; then DRY_RUN=1; else ARGS+=("$a"); fi
done
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python}
run() {
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
run_bg() {  # background process; its PID is appended to PIDS
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; printf ' &\n'; else "$@" & PIDS+=($!); fi
}
wait_healthy() {  # wait_healthy URL [seconds]
  if [ "$DRY_RUN" = 1 ]; then printf '+ wait for %s/health\n' "$1"; return 0; fi
  local deadline=$((SECONDS + ${2:-900}))
  until curl -sf "$1/health" >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "timed out waiting for $1" >&2; return 1; }
    sleep 5
  done
}
config_value() {  # config_value FIELD...: the config's fields with this run's --set values applied
  "$PYTHON" "$LAUNCH_DIR/config_value.py" "$CONFIG" "$@" "${SETS[@]}"
}
split_sets() {  # SETS = the --set key=value pairs of "$@", as the trainer will get them
  SETS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --set) SETS+=(--set "$2"); shift 2 ;;
      --set=*) SETS+=(--set "${1#--set=}"); shift ;;
      *) echo "unknown argument $1 (expected --set key=value)" >&2; exit 2 ;;
    esac
  done
}
url_port() { local p=${1##*:}; echo "${p%%/*}"; }
