# Sourced by the launch scripts: `run` prints the command under --dry-run, else executes it.
DRY_RUN=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--dry-run" ]; then DRY_RUN=1; else ARGS+=("$a"); fi
done
run() {
  if [ "$DRY_RUN" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi
}
run_bg() {  # background process; its PID is appended to PIDS
  if [ "$DRY_RUN" = 1 ]; then printf '+ %s &\n' "$*"; else "$@" & PIDS+=($!); fi
}
wait_healthy() {  # wait_healthy URL [seconds]
  [ "$DRY_RUN" = 1 ] && { printf '+ wait for %s/health\n' "$1"; return 0; }
  local deadline=$((SECONDS + ${2:-900}))
  until curl -sf "$1/health" >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "timed out waiting for $1" >&2; return 1; }
    sleep 5
  done
}
