# dev/lib.sh: what the bounded device runs (dev/realshape/run.sh,
# dev/v4/run.sh) share; they source it after cd to the repository root and
# after setting:
#
#   R           the results folder (logs, stages.txt, run.log)
#   OUTDIR      where pack writes PACK_NAME (a .tar.gz of R)
#   PACK_NAME   the results tarball's name
#   STAGE_KILL_AFTER  seconds between timeout's TERM and KILL
#   STAGE_DETAIL      1: END lines and stages.txt give the estimate, a
#                     budget skip its numbers (and packs), a cut stage a CUT
#                     line (dev/v4/run.sh's log); empty: the shorter lines
#   GPU         1 where a stage marked gpu may run
#
# and defining stage_limit EST (prints the seconds a stage of that estimate
# may run) and stage_digest FILE (prints a stage log's lines for run.log).
#
# Stages run as `bash -c FUNCTION`: the functions they call must be
# exported (export -f), and so cannot hold a here-document (bash cannot
# export one): dev/benchjson.py is a file for that reason. DEV (this folder,
# absolute) is exported for them.

DEV=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEV

# pack: R as $OUTDIR/$PACK_NAME, replaced whole (a run cut short still
# leaves the last complete one).
pack() { tar -C "$R" -czf "$OUTDIR/$PACK_NAME.tmp" . 2>/dev/null && mv "$OUTDIR/$PACK_NAME.tmp" "$OUTDIR/$PACK_NAME"; }

# log LINE: LINE with the time and the seconds since the start, to stdout
# and $R/run.log.
log() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$R/run.log"; }

# unpack TARBALL DIR: the prepared binaries (python3's tarfile, else xz and
# tar); fails saying so.
unpack() {
  python3 -c 'import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2" ||
    xz -dc "$1" | tar -C "$2" -xf - || { echo "cannot unpack $1" >&2; return 1; }
}

# stage NAME ESTIMATE_S FUNCTION [gpu]: runs FUNCTION (bash -c, output in
# $R/NAME.log) unless it is marked gpu and GPU is not 1, or elapsed +
# estimate would pass BUDGET; cut by timeout at stage_limit's seconds; then
# stage_digest's lines of its log go to run.log, and the results are packed.
stage() {
  local name=$1 est=$2 fn=$3 gpu=${4:-}
  if [ -n "$gpu" ] && [ "${GPU:-}" != 1 ]; then
    log "SKIP $name: no GPU (nvidia-smi -L failed; FORCE=1 runs it anyway)"
    echo "$name skipped (no GPU)" >> "$R/stages.txt"
    return
  fi
  local expected=""
  [ "${STAGE_DETAIL:-}" != 1 ] || expected=" (expected ~${est}s)"
  if [ $((SECONDS + est)) -gt "$BUDGET" ]; then
    log "SKIP $name: ${SECONDS}s elapsed + ~${est}s expected > BUDGET ${BUDGET}s"
    if [ "${STAGE_DETAIL:-}" = 1 ]; then
      echo "$name skipped (budget: ${SECONDS}s + ~${est}s)" >> "$R/stages.txt"
      pack
    else
      echo "$name skipped (budget)" >> "$R/stages.txt"
    fi
    return
  fi
  local start=$SECONDS limit
  limit=$(stage_limit "$est")
  log "START $name (expected ~${est}s, cut at ${limit}s)"
  timeout --signal=TERM --kill-after="$STAGE_KILL_AFTER" "$limit" bash -c "$fn" > "$R/$name.log" 2>&1
  local rc=$?
  if [ "${STAGE_DETAIL:-}" = 1 ] && { [ $rc -eq 124 ] || [ $rc -eq 137 ]; }; then
    log "CUT $name at ${limit}s"
  fi
  log "END $name rc=$rc in $((SECONDS - start))s$expected"
  echo "$name rc=$rc $((SECONDS - start))s$expected" >> "$R/stages.txt"
  stage_digest "$R/$name.log" | sed "s/^/  $name| /" | tee -a "$R/run.log"
  pack
}
