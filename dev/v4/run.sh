#!/usr/bin/env bash
# Issue 59's device benchmarks in one bounded call (<= 9.5 minutes): the
# all-GPU DeepSeek-V4 step with its per-kernel profile, experts in host
# memory, MTP speculative decoding's verify cost, long context, and a few
# layers of the full V4-Flash shape in its released format.
#
#   dev/v4/run.sh prepare       here (no GPU): builds engine.test, bench and
#                               write (CGO_ENABLED=0) into .device/v4/bin.tar.xz
#                               (about 13 MB; fails above CARRY_MAX_MB=25)
#   dev/v4/run.sh [STAGE ...]   on the device machine, carrying .device/v4:
#                               the stages below in priority order, each timed;
#                               a stage is skipped when elapsed + its estimate
#                               would pass BUDGET, and cut at 2 x estimate + 30 s
#                               or at HARD (whichever first). Results: ONE
#                               tarball, $OUT/v4run.tar.gz, rewritten after
#                               every stage (logs, RESULT lines, summary.txt).
#
# One checkpoint serves every 32-expert stage: `write` writes the testmodel
# shape deepseek-v4-bench-mtp (25.8 GB: deepseek-v4-bench plus its mtp.0.*
# block; the same config.json, so BenchmarkDecodeDeepseekV4's
# MANIFOLD_BENCH_DIR check accepts it, and the MTP tensors are not loaded
# unless speculative decoding is on) into $WORK/v4 with testmodel's stamp,
# which MANIFOLD_BENCH_SPEC_DIR (BenchmarkSpeculativeV4) and bench -keep reuse.
#
# Stages (default: all, in this order; name some to run only those).
# Estimates are for 16 cores; W = the measured write rate (WRITE_GBPS until
# `write` has run):
#   setup         GPU, driver, disk, memory, cores                     (~5 s)
#   write         write -shape deepseek-v4-bench-mtp -out $WORK/v4     (~26 GB / W: ~75 s)
#   decode        BenchmarkDecodeDeepseekV4 (MANIFOLD_BENCH_DIR=$WORK/v4):
#                 RESULT decodev4 (tok/s, floor, of_floor), _graphs, _no_pdl,
#                 _generate, decodev4_profile + the per-kernel table (~70 s)
#   offload       BenchmarkDecodeDeepseekV4Offload: RESULT decodev4_offload,
#                 experts all on the GPU / half / all in host memory (CPU),
#                 tok/s against each plan's floor                      (~100 s)
#   spec-implied  BenchmarkSpeculativeV4/cuda/implied-k=1,2,3 on the same
#                 checkpoint (MANIFOLD_BENCH_SPEC_SHAPE=deepseek-v4-bench-mtp,
#                 MANIFOLD_BENCH_SPEC_DIR=$WORK/v4), -test.benchtime
#                 $SPEC_BENCHTIME: step-ms, spec-step-ms (k drafts + verify),
#                 speedup@88% (two loads of 26 GB a sub-benchmark)     (~80 s)
#   long-4k       BenchmarkLongContextDeepseekV4, MANIFOLD_BENCH_V4_CONTEXTS=4096:
#                 RESULT longv4 (ttft_s, decode_ms, ctx_read_MB)      (~15 s)
#   long-128k     the same at 131072                                  (~45 s)
#   flash         bench -random deepseek-v4-flash -layers N -keep $WORK/flash
#                 (released FP8 + MXFP4, all 256 experts; 2.15 GB + 3.57 GB
#                 a layer): N = V4F_LAYERS cut to what the disk and the
#                 budget hold; tok/s, floor, of floor          (~write / W + 30 s)
#   long-1M       the same at 1048576 (64-row prefill passes)         (~180 s)
#   spec-verify   BenchmarkSpeculativeV4/cuda/verify-n=1..4: the main model's
#                 forward over n = k + 1 rows (ns/op)                  (~100 s)
#   cli           bench -random deepseek-v4-bench-mtp -keep $WORK/v4 -profile
#                 (the public API's tg rate; kernel table on stderr)   (~45 s)
#   spec-gen      BenchmarkSpeculativeV4/cuda/{off,k=1,2,3} at 1x: Generate
#                 tokens/s with MTP on (random weights: acceptance ~0) (~60 s)
#
# Environment: BUDGET (555 s), HARD (570 s: every stage is cut by then),
# WORK (/tmp/manifold-v4: checkpoints), V4F_LAYERS (6), WRITE_GBPS (0.35, the
# estimate before `write` measures it), LOAD_S (12: seconds to load the
# 26 GB checkpoint), SPEC_BENCHTIME (10x), BENCH_ARGS (-p 16 -n 32 -r 2, for
# flash), FORCE=1 (run GPU stages without a GPU: the dry run), WRITE_ARGS
# (dry run only, e.g. -layers 1: a cut checkpoint, whose config.json the
# engine benchmarks would not accept).
set -uo pipefail
cd "$(dirname "$0")/../.."
. dev/lib.sh

if [ "${1:-}" = prepare ]; then
  set -e
  st=.device/v4/stage
  rm -rf "$st" .device/v4/bin && mkdir -p "$st"  # bin: where an older version unpacked
  CGO_ENABLED=0 go test -c -ldflags='-s -w' -o "$st/engine.test" ./engine
  CGO_ENABLED=0 go build -ldflags='-s -w' -o "$st/bench" ./cmd/bench
  CGO_ENABLED=0 go build -ldflags='-s -w' -o "$st/write" ./internal/testmodel/write
  git rev-parse HEAD > "$st/commit" 2>/dev/null || true
  tar -C "$st" -cf - . | xz -9e -T2 > .device/v4/bin.tar.xz
  rm -rf "$st"
  size=$(stat -c %s .device/v4/bin.tar.xz)
  total=$(du -sb .device/v4 | cut -f1)
  echo "built .device/v4/bin.tar.xz: $((size >> 10)) KiB; .device/v4 in all $((total >> 10)) KiB (carry [\".device/v4\"])"
  if [ "$total" -gt $(( ${CARRY_MAX_MB:-25} << 20 )) ]; then
    echo "carry over ${CARRY_MAX_MB:-25} MiB" >&2
    exit 1
  fi
  exit 0
fi

BUDGET=${BUDGET:-555}
HARD=${HARD:-570}
WORK=${WORK:-/tmp/manifold-v4}
V4F_LAYERS=${V4F_LAYERS:-6}
WRITE_GBPS=${WRITE_GBPS:-0.35}
LOAD_S=${LOAD_S:-12}
SPEC_BENCHTIME=${SPEC_BENCHTIME:-10x}
BENCH_ARGS=${BENCH_ARGS:--p 16 -n 32 -r 2}
OUTDIR=${OUT:-/tmp/v4run-out}
R="$WORK/results"
BIN="$WORK/bin"
V4="$WORK/v4"
FLASH="$WORK/flash"
rm -rf "$R"
mkdir -p "$R" "$OUTDIR"

# The binaries, unpacked outside the tree (so that a dry run here leaves
# nothing the next carry would take along), afresh each call.
[ -f .device/v4/bin.tar.xz ] || { echo "no .device/v4/bin.tar.xz: run 'dev/v4/run.sh prepare' on the build machine and carry .device/v4" >&2; exit 2; }
rm -rf "$BIN" && mkdir -p "$BIN"
unpack .device/v4/bin.tar.xz "$BIN" || exit 2

GPU=0
nvidia-smi -L > /dev/null 2>&1 && GPU=1
[ "${FORCE:-}" != 1 ] || GPU=1

# stage's policy (dev/lib.sh): a stage marked gpu needs GPU; one is cut at
# min(2 x estimate + 30, HARD - elapsed) seconds.
PACK_NAME=v4run.tar.gz STAGE_KILL_AFTER=5 STAGE_DETAIL=1
stage_limit() {
  local limit=$((2 * $1 + 30))
  [ "$limit" -le $((HARD - SECONDS)) ] || limit=$((HARD - SECONDS))
  echo "$limit"
}
stage_digest() {
  grep -E '^(RESULT|WRITE|BENCH|Benchmark|--- (FAIL|SKIP)|FAIL|PASS|panic)|wrote|bench: (writing|wrote|reusing)|tok/s|[Ee]rror|out of memory|^\| ' "$1" |
    grep -v '^bench: +[0-9]*%' | head -40
}

export BIN WORK R V4 FLASH SPEC_BENCHTIME BENCH_ARGS WRITE_ARGS=${WRITE_ARGS:-}

setup() {
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv
  df -h "$WORK" /tmp .
  free -g
  nproc
  cat "$BIN/commit" 2>/dev/null
  cat /sys/block/*/queue/rotational 2>/dev/null | tr '\n' ' '; echo
}

# write: the shared 32-expert checkpoint with its MTP block (stamped).
write_v4() {
  local start=$SECONDS
  # shellcheck disable=SC2086
  "$BIN/write" -shape deepseek-v4-bench-mtp ${WRITE_ARGS:-} -out "$V4" || return 1
  local s=$((SECONDS - start)) b
  b=$(du -sb "$V4" | cut -f1)
  echo "WRITE bytes=$b seconds=$s GBps=$(python3 -c "print(f'{$b / max($s, 1) / 1e9:.3f}')")"
  df -h "$WORK"
}

need_v4() { [ -f "$V4/config.json" ] && [ -f "$V4/.testmodel-shape.json" ] || { echo "no checkpoint in $V4 (stage write)"; exit 3; }; }
export -f need_v4

decode() {
  need_v4
  cd engine && MANIFOLD_BENCH_DIR="$V4" "$BIN/engine.test" -test.run '^$' -test.bench '^BenchmarkDecodeDeepseekV4$' -test.benchtime 1x -test.v
}

offload() {
  need_v4
  cd engine && MANIFOLD_BENCH_DIR="$V4" "$BIN/engine.test" -test.run '^$' -test.bench '^BenchmarkDecodeDeepseekV4Offload$' -test.benchtime 1x -test.v
}

# spec PATTERN BENCHTIME: BenchmarkSpeculativeV4's cuda sub-benchmarks
# matching PATTERN on the shared checkpoint.
spec() {
  need_v4
  cd engine && MANIFOLD_BENCH_SPEC_SHAPE=deepseek-v4-bench-mtp MANIFOLD_BENCH_SPEC_DIR="$V4" \
    "$BIN/engine.test" -test.run '^$' -test.bench "^BenchmarkSpeculativeV4\$/^cuda\$/$1" -test.benchtime "$2" -test.v
}
export -f spec
spec_implied() { spec '^implied-k=[123]$' "$SPEC_BENCHTIME"; }
spec_verify() { spec '^verify-n=[1234]$' "$SPEC_BENCHTIME"; }
spec_gen() { spec '^(off|k=[123])$' 1x; }

long() {
  cd engine && MANIFOLD_BENCH_V4_CONTEXTS="$1" "$BIN/engine.test" -test.run '^$' -test.bench '^BenchmarkLongContextDeepseekV4$' -test.benchtime 1x -test.v
}
export -f long
long_4k() { long 4096; }
long_128k() { long 131072; }
long_1m() { long 1048576; }

# benchjson FILE: one line per test of cmd/bench's JSON.
benchjson() { python3 "$DEV/benchjson.py" --bench "$1" || true; }
export -f benchjson

flash() {
  # shellcheck disable=SC2086
  "$BIN/bench" -device cuda -random deepseek-v4-flash -layers "$1" -keep "$FLASH" $BENCH_ARGS -o json > "$R/bench-flash.json"
  local rc=$?
  [ -s "$R/bench-flash.json" ] && benchjson "$R/bench-flash.json"
  du -sh "$FLASH"
  rm -rf "$FLASH"
  return $rc
}

cli() {
  need_v4
  "$BIN/bench" -device cuda -random deepseek-v4-bench-mtp -keep "$V4" -p 512 -n 128 -r 2 -profile -o json > "$R/bench-cli.json"
  local rc=$?
  [ -s "$R/bench-cli.json" ] && benchjson "$R/bench-cli.json"
  return $rc
}

export -f setup write_v4 decode offload spec_implied spec_verify spec_gen long_4k long_128k long_1m flash cli

# flash_stage: the layer count the disk and the budget hold, then the stage.
flash_stage() {
  local free gbps l est
  free=$(df -B1 --output=avail "$WORK" | tail -1)
  gbps=${MEASURED_GBPS:-$WRITE_GBPS}
  # 2.15 GB + 3.57 GB a layer, a 4.3 GB shard temporary and 2 GB to spare.
  l=$(python3 -c "print(max(0, min($V4F_LAYERS, int(($free / 1e9 - 2.15 - 4.3 - 2) / 3.57))))")
  if [ "$l" -lt 1 ]; then
    log "flash: ${free} bytes free on $WORK hold no layer"
    echo "flash skipped (disk)" >> "$R/stages.txt"
    return
  fi
  while :; do
    est=$(python3 -c "print(int((2.15 + 3.57 * $l) / $gbps + (2.15 + 3.57 * $l) / 26 * $LOAD_S + 25))")
    [ "$l" -gt 1 ] && [ $((SECONDS + est)) -gt "$BUDGET" ] || break
    l=$((l - 1))
  done
  log "flash: $l layers (V4F_LAYERS $V4F_LAYERS; $((free >> 30)) GiB free; write ~${gbps} GB/s)"
  stage flash "$est" "flash $l" gpu
}

summary() {
  {
    echo "== stages"
    cat "$R/stages.txt" 2>/dev/null
    echo "== checkpoint write"
    grep -h '^WRITE' "$R"/write.log 2>/dev/null
    echo "== all-GPU V4 step (32 experts; floor = weight bytes / copy bandwidth)"
    grep -hE '^RESULT decodev4(_graphs|_no_pdl|_generate|_profile)? ' "$R"/decode.log 2>/dev/null
    if [ -f "$R/decode.log" ]; then
      echo "-- per-kernel device time (8 steps, top 20)"
      awk '/^kernel +launches +device time +share/{p=1} p&&n<21{print; n++}' "$R/decode.log"
    fi
    echo "== experts in host memory (floor = device bytes / copy + host bytes / host read bandwidth)"
    grep -h '^RESULT decodev4_offload' "$R"/offload.log 2>/dev/null
    echo "== MTP: step vs k drafts + verify (speedup@88% acceptance), verify-n forward cost, Generate with MTP"
    cat "$R"/spec-*.log 2>/dev/null | python3 -c '
import re, sys
rows = {}
for line in sys.stdin:
    m = re.match(r"BenchmarkSpeculativeV4/cuda/(\S+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op(.*)", line)
    if not m:
        continue
    print(line.rstrip())
    metrics = dict((u, float(v)) for v, u in re.findall(r"([\d.e+-]+) (\S+)", m.group(4)))
    metrics["ns/op"] = float(m.group(3))
    rows[m.group(1)] = metrics
for k in (1, 2, 3):
    r = rows.get("implied-k=%d" % k)
    if r and r.get("step-ms"):
        st, sp, sx = r["step-ms"], r.get("spec-step-ms", 0), r.get("speedup@88%", 0)
        print("SPEC k=%d: step %.2f ms, %d drafts + verify %.2f ms (%.2f steps), speedup at 88%% acceptance %.2fx" % (k, st, k, sp, sp / st, sx))
one = rows.get("verify-n=1", {}).get("ns/op")
for n in (2, 3, 4):
    r = rows.get("verify-n=%d" % n)
    if r and one:
        v = r["ns/op"]
        print("SPEC verify of %d rows (k = %d): %.2f ms = %.2f x one row (%.2f ms)" % (n, n - 1, v / 1e6, v / one, one / 1e6))
'
    echo "== long context (ttft_s, decode_ms against ctx_read_MB)"
    grep -h '^RESULT longv4' "$R"/long-*.log 2>/dev/null
    echo "== V4-Flash released format (256 experts), and the 32-expert model through cmd/bench"
    grep -h '^BENCH' "$R"/flash.log "$R"/cli.log 2>/dev/null
    echo "== failures"
    grep -hE -- '--- FAIL|^FAIL|panic:|out of memory|CUDA_ERROR' "$R"/*.log 2>/dev/null | head -20
  } > "$R/summary.txt"
  cat "$R/summary.txt"
}

default=(setup write decode offload spec-implied long-4k long-128k flash long-1M spec-verify cli spec-gen)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=("${default[@]}")
log "v4run: stages ${stages[*]}; BUDGET ${BUDGET}s HARD ${HARD}s; WORK $WORK; GPU $GPU; V4F_LAYERS $V4F_LAYERS"
for s in "${stages[@]}"; do
  case $s in
  setup) stage setup 5 setup ;;
  write)
    if [ -f "$V4/config.json" ] && [ -f "$V4/.testmodel-shape.json" ] && grep -q '"complete": true' "$V4/.testmodel-shape.json"; then
      log "write: reusing $V4"
    else
      stage write "$(python3 -c "print(int(25.8 / $WRITE_GBPS))")" write_v4 gpu
      g=$(grep -ho 'GBps=[0-9.]*' "$R/write.log" 2>/dev/null | cut -d= -f2)
      # A rate that prints as 0 (a dry run's instant write) would divide the flash estimate by zero: keep the default.
      python3 -c "import sys; sys.exit(0 if float('${g:-0}') > 0 else 1)" 2>/dev/null && MEASURED_GBPS=$g
    fi
    ;;
  decode) stage decode $((LOAD_S + 60)) decode gpu ;;
  offload) stage offload $((3 * LOAD_S + 60)) offload gpu ;;
  spec-implied) stage spec-implied $((6 * LOAD_S + 10)) spec_implied gpu ;;
  spec-verify) stage spec-verify $((8 * LOAD_S + 10)) spec_verify gpu ;;
  spec-gen) stage spec-gen $((4 * LOAD_S + 15)) spec_gen gpu ;;
  long-4k) stage long-4k 15 long_4k gpu ;;
  long-128k) stage long-128k 45 long_128k gpu ;;
  long-1M) stage long-1M 180 long_1m gpu ;;
  flash) flash_stage ;;
  cli) stage cli $((LOAD_S + 35)) cli gpu ;;
  *) log "unknown stage $s (${default[*]})" ;;
  esac
done
log "done in ${SECONDS}s; results: $OUTDIR/v4run.tar.gz"
summary
pack
