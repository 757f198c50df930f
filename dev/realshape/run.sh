#!/usr/bin/env bash
# Issue 58's device evidence in one bounded run: the real-shape checks
# (Manifold's CPU and GPU logits against transformers at the released
# dimensions) and the benchmarks (FP8 and MXFP4 m = 1 matmuls against the
# copy bandwidth; decode tokens/s of the released shapes against their floor).
#
#   dev/realshape/run.sh prepare        here (no GPU): builds the static
#                                       binaries into .device/realshape.tar.xz
#                                       (kernels.test, bench: about 7 MiB)
#   dev/realshape/run.sh [STAGE ...]    on the device machine (carry .device):
#                                       the stages below in order, each timed,
#                                       one skipped when the time it is expected
#                                       to take would pass BUDGET; results in
#                                       $OUT/realshape.tar.gz (written again
#                                       after every stage, so a run cut short
#                                       still leaves what it did)
#
# Stages (default: all, in this order; name some to run only those):
#   setup       GPU, disk, memory, torch / transformers versions
#   image       (REBUILD=1 or named) kernels/build.sh: the kernel image from
#               this tree's sources (gemv_fp8_tma is not in the committed
#               one), copied to the results for committing; the test binaries
#               of the later stages run on it (MANIFOLD_KERNEL_IMAGE) (~150 s)
#   fp8tma      (with the rebuilt image) gemv_fp8_tma, the bulk-copy FP8 m = 1
#               GEMV: TestFP8MatMul/tma and TestConformance/fp8-gemv-bulk-copy
#               against the CPU, then BenchmarkFP8GEMV's m = 1 rows of fp8,
#               fp8-gemv and fp8-tma in one run                    (~40 s)
#   kbench      BenchmarkFP8GEMV at m = 1 (fp8: the default kernel, fp8-gemv:
#               the CUDA-core GEMV) on V3's and V4's shapes, and
#               BenchmarkMoEReleased (V4-Flash's 256 MXFP4 experts and the
#               NVFP4 twin, V3's 256 FP8 experts, grouped, m = 1): of_copy =
#               effective bytes / time / copy bandwidth           (~45 s)
#   qwen-rs     gen_moe_fixtures.py --real-shape --arch qwen3_moe (two layers
#               of Qwen3-30B-A3B, 1.5 GB), then TestRealShapeOnGPU  (~60 s)
#   v4-rs       gen_v4_released.py --real-shape --layers $V4RS_LAYERS (two
#               layers of V4-Flash, 9 GB, FP8 + MXFP4; transformers' float32
#               model on the GPU: 58 GB), then TestRealShapeOnGPU   (~110 s)
#   bench-v4    cmd/bench -random deepseek-v4-flash -layers $V4_LAYERS (the
#               released FP8 + MXFP4 format, all 256 experts; 2.1 GB + 3.3 GB
#               a layer on disk)                                   (~20 s + 10 s a layer)
#   bench-qwen  cmd/bench -random qwen3-30b-a3b -layers $QWEN_LAYERS (bf16;
#               QWEN_LAYERS=48 is the whole model: 61 GB, about 4 minutes
#               to write and load)                                 (~20 s + 5 s a layer)
#   bench-v3    cmd/bench -random deepseek-v3-2l (FP8, 16 GB)      (~70 s)
#   v3-rs       gen_moe_fixtures.py --real-shape --arch deepseek_v3 (two layers
#               of DeepSeek-V3, 16 GB FP8; transformers' float32 model on the
#               GPU: 56 GB), then TestRealShapeOnGPU               (~200 s)
#
# Environment: BUDGET (seconds, default 360), WORK (default
# /tmp/manifold-realshape: checkpoints, reused by a later call on the same
# warm machine when KEEP=1, else removed after their stage to leave disk for
# the next), V4_LAYERS (6), QWEN_LAYERS (12), V4RS_LAYERS (2),
# BENCH_ARGS (-p 16 -n 32 -r 2), REBUILD (1: the image and fp8tma stages
# first), MANIFOLD_REALSHAPE_TOL and
# MANIFOLD_REALSHAPE_GPU_TOL (TestRealShapeOnGPU's bounds).
set -uo pipefail
cd "$(dirname "$0")/../.."
. dev/lib.sh

if [ "${1:-}" = prepare ]; then
  set -e
  rm -rf .device/rs-stage && mkdir -p .device/rs-stage
  CGO_ENABLED=0 go test -c -ldflags='-s -w' -o .device/rs-stage/kernels.test ./kernels
  CGO_ENABLED=0 go build -ldflags='-s -w' -o .device/rs-stage/bench ./cmd/bench
  tar -C .device/rs-stage -cf - . | xz -9e -T2 > .device/realshape.tar.xz
  rm -rf .device/rs-stage
  echo "built .device/realshape.tar.xz: $(( $(stat -c %s .device/realshape.tar.xz) >> 10 )) KiB (carry .device)"
  exit 0
fi

BUDGET=${BUDGET:-360}
WORK=${WORK:-/tmp/manifold-realshape}
V4_LAYERS=${V4_LAYERS:-6}
QWEN_LAYERS=${QWEN_LAYERS:-12}
V4RS_LAYERS=${V4RS_LAYERS:-2}
BENCH_ARGS=${BENCH_ARGS:--p 16 -n 32 -r 2}
OUTDIR=${OUT:-/tmp/realshape-out}
R="$WORK/results"
BIN="$PWD/.device/realshape"
mkdir -p "$R" "$OUTDIR" "$WORK/rs"
export MANIFOLD_REALSHAPE_TOL=${MANIFOLD_REALSHAPE_TOL:-1e-2} MANIFOLD_REALSHAPE_GPU_TOL=${MANIFOLD_REALSHAPE_GPU_TOL:-2e-2}

if [ ! -x "$BIN/kernels.test" ]; then
  [ -f .device/realshape.tar.xz ] || { echo "no .device/realshape.tar.xz: run 'dev/realshape/run.sh prepare' on the build machine and carry .device" >&2; exit 2; }
  mkdir -p "$BIN"
  unpack .device/realshape.tar.xz "$BIN"
fi

# stage's policy (dev/lib.sh): a stage is cut by timeout at 1.5 x its
# estimate plus what the budget has left.
PACK_NAME=realshape.tar.gz STAGE_KILL_AFTER=10 STAGE_DETAIL=
stage_limit() { echo $(( BUDGET - SECONDS + $1 / 2 )); }
stage_digest() {
  grep -E '^(RESULT|--- |FAIL|ok|PASS)|realshape_test.go|dlogit|top-1|tok/s|floor|wrote|bench: (writing|wrote|reusing)|^\| |seconds|GB drawn|written to|[Ee]rror|panic|Traceback|^bench: -|SystemExit|Assertion' "$1" | head -80
}

export BIN WORK R V4_LAYERS QWEN_LAYERS V4RS_LAYERS BENCH_ARGS KEEP=${KEEP:-}

setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  df -h "$WORK" /tmp .
  free -g
  nproc
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  git log --oneline -1 2>/dev/null || true
}

image() {
  kernels/build.sh && cp kernels/manifold.fatbin kernels/manifold.fatbin.sum "$R/"
}

fp8tma() {
  [ -n "${MANIFOLD_KERNEL_IMAGE:-}" ] || { echo "no rebuilt image (stage image): the committed one lacks gemv_fp8_tma"; return 1; }
  cd kernels
  local rc=0
  for run in '^TestFP8MatMul$/^tma$' '^TestConformance$/^fp8-gemv-bulk-copy$'; do
    "$BIN/kernels.test" -test.run "$run" -test.count=1 -test.v >> "$R/fp8tma-test.log" 2>&1 || rc=1
    grep -cE -- '--- PASS' "$R/fp8tma-test.log" | sed "s|^|$run: passed |"
    grep -E -- '--- FAIL|^FAIL|panic' "$R/fp8tma-test.log" | head -20
  done
  "$BIN/kernels.test" -test.run '^$' -test.benchtime 1x \
    -test.bench '^BenchmarkFP8GEMV$/^(fp8|fp8-gemv|fp8-tma)$/^(18432x7168|7168x18432|4096x7168|24576x1536|2048x4096|4096x2048)$/^m=1$'
  return $rc
}

kbench() {
  cd kernels
  "$BIN/kernels.test" -test.run '^$' -test.benchtime 1x \
    -test.bench '^BenchmarkFP8GEMV$/^(fp8|fp8-gemv)$/^(18432x7168|7168x18432|4096x7168|24576x1536|2048x4096|4096x2048)$/^m=1$'
  "$BIN/kernels.test" -test.run '^$' -test.benchtime 1x -test.bench '^BenchmarkMoEReleased$'
}

# realshape DIR: Manifold's GPU and CPU logits on DIR against its golden.
realshape() {
  (cd kernels && MANIFOLD_REALSHAPE_DIR="$1" "$BIN/kernels.test" -test.run '^TestRealShapeOnGPU$' -test.v -test.count=1 -test.timeout 20m)
  local rc=$?
  mkdir -p "$R/$(basename "$1")" && cp "$1"/summary.json "$1"/config.json "$R/$(basename "$1")/" 2>/dev/null
  return $rc
}
export -f realshape

gone() { [ -n "$KEEP" ] || rm -rf "$@"; }
export -f gone

qwen_rs() {
  local d="$WORK/rs/qwen3_moe_real"
  [ -f "$d/golden.safetensors" ] || python3 model/testdata/gen_moe_fixtures.py --real-shape --arch qwen3_moe --out "$WORK/rs" || return 1
  du -sh "$d"
  realshape "$d"; local rc=$?
  gone "$d"
  return $rc
}

v4_rs() {
  local d="$WORK/rs/deepseek_v4_flash_real"
  [ -f "$d/golden.safetensors" ] || python3 model/testdata/gen_v4_released.py --real-shape --layers "$V4RS_LAYERS" --out "$WORK/rs" || return 1
  du -sh "$d"
  realshape "$d"; local rc=$?
  gone "$d"
  return $rc
}

v3_rs() {
  local d="$WORK/rs/deepseek_v3_real"
  [ -f "$d/golden.safetensors" ] || python3 model/testdata/gen_moe_fixtures.py --real-shape --arch deepseek_v3 --no-fp8-loader --out "$WORK/rs" || return 1
  du -sh "$d"
  realshape "$d"; local rc=$?
  gone "$d"
  return $rc
}

# benchrun NAME [bench flags]: cmd/bench on the GPU into $R/bench-NAME.json.
benchrun() {
  local name=$1; shift
  local keep="$WORK/ck-$name"
  # shellcheck disable=SC2086
  "$BIN/bench" -device cuda "$@" -keep "$keep" $BENCH_ARGS -o json > "$R/bench-$name.json"
  local rc=$?
  cat "$R/bench-$name.json"
  [ -s "$R/bench-$name.json" ] && python3 "$DEV/benchjson.py" "$R/bench-$name.json" || true
  du -sh "$keep"
  gone "$keep"
  return $rc
}
export -f benchrun

bench_v4() { benchrun v4 -random deepseek-v4-flash -layers "$V4_LAYERS"; }
bench_qwen() { benchrun qwen -random qwen3-30b-a3b -layers "$QWEN_LAYERS"; }
bench_v3() { benchrun v3 -random deepseek-v3-2l; }

export -f setup image fp8tma kbench qwen_rs v4_rs v3_rs bench_v4 bench_qwen bench_v3

stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then
  stages=(setup kbench qwen-rs v4-rs bench-v4 bench-qwen bench-v3 v3-rs)
  [ "${REBUILD:-}" != 1 ] || stages=(setup image fp8tma "${stages[@]:1}")
fi
log "realshape: stages ${stages[*]}; BUDGET ${BUDGET}s; WORK $WORK; V4_LAYERS $V4_LAYERS QWEN_LAYERS $QWEN_LAYERS V4RS_LAYERS $V4RS_LAYERS"
for s in "${stages[@]}"; do
  case $s in
  setup) stage setup 10 setup ;;
  image)
    stage image 150 image
    [ ! -f "$R/manifold.fatbin" ] || export MANIFOLD_KERNEL_IMAGE="$PWD/kernels/manifold.fatbin"
    ;;
  fp8tma) stage fp8tma 40 fp8tma ;;
  kbench) stage kbench 45 kbench ;;
  qwen-rs) stage qwen-rs 60 qwen_rs ;;
  v4-rs) stage v4-rs 110 v4_rs ;;
  bench-v4) stage bench-v4 $((20 + 10 * V4_LAYERS)) bench_v4 ;;
  bench-qwen) stage bench-qwen $((20 + 5 * QWEN_LAYERS)) bench_qwen ;;
  bench-v3) stage bench-v3 70 bench_v3 ;;
  v3-rs) stage v3-rs 200 v3_rs ;;
  *) log "unknown stage $s (setup image fp8tma kbench qwen-rs v4-rs bench-v4 bench-qwen bench-v3 v3-rs)" ;;
  esac
done
log "done in ${SECONDS}s; results: $OUTDIR/realshape.tar.gz"
pack
