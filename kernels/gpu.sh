#!/usr/bin/env bash
# GPU tests and benchmarks in two steps, because this machine has no GPU:
#   kernels/gpu.sh prepare   here: builds static test binaries and copies the
#                            fixtures ($MANIFOLD_GOLDEN_DIR, without its
#                            tokenizers) into one xz'd tar, .device/bundle.tar.xz,
#                            and checks that it fits the device tool's 64 MiB
#                            carry beside the tracked files (leaving the bf16
#                            fixtures out where they do not fit); FIXTURES=1
#                            adds the random-checkpoint writer for the fixture
#                            scripts ("prepare dev": the
#                            dev build's, -tags manifold_dev, dev/README.md)
#   kernels/gpu.sh run       on the device machine (device tool: carry .device):
#                            unpacks the bundle, runs every GPU test, then the
#                            benchmarks, logs to $OUT (DEV=1: builds the dev
#                            image there and runs the binaries with it)
#   kernels/gpu.sh check     here, before device time is spent on a kernel
#                            change: the CUDA sources through nvcc's front end
#                            (-ptx), the production image's and the dev image's
#                            (-DMANIFOLD_DEV), which needs only an nvcc, such as Debian's
#                            nvidia-cuda-toolkit (11.8, bookworm non-free);
#                            its ptxas is too old for the image's sm_90
#                            instructions, so the image is built on the device
# .device/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
unpack() { # the bundle's binaries and fixtures, once per fresh copy
  if [ -f .device/bundle.tar.xz ] && [ ! -x .device/engine.test ]; then
    python3 -c 'import tarfile, sys; tarfile.open(sys.argv[1]).extractall(".device")' .device/bundle.tar.xz
  fi
}
case "${1:-}" in
prepare)
  rm -rf .device && mkdir -p .device/stage
  cp -r "${MANIFOLD_GOLDEN_DIR:-../shared/golden}" .device/stage/golden && chmod -R u+w .device/stage/golden
  rm -rf .device/stage/golden/tokenizers # 21 MB; the tests that need them skip themselves
  tags=""
  if [ "${2:-}" = dev ]; then tags="-tags=manifold_dev"; fi
  for pkg in kernels engine; do
    CGO_ENABLED=0 go test -c $tags -ldflags='-s -w' -o ".device/stage/$pkg.test" "./$pkg"
  done
  if [ "${FIXTURES:-}" = 1 ]; then
    # Random checkpoints of named shapes, for the fixture scripts (engine/testdata/gen_longrope.py).
    CGO_ENABLED=0 go build -ldflags='-s -w' -o .device/stage/write ./internal/testmodel/write
  fi
  tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
  pack() { tar -C .device/stage -cf - . | xz -9e -T2 > .device/bundle.tar.xz; stat -c %s .device/bundle.tar.xz; }
  bundle=$(pack)
  if [ $((bundle + tracked)) -gt $((64 << 20)) ]; then
    # The carry is 64 MiB: leave the bf16 fixtures out (their GPU golden tests then skip).
    rm -rf .device/stage/golden/*/bf16
    bundle=$(pack)
    echo "the golden bf16 folders are left out to fit the carry: their GPU tests skip"
  fi
  rm -rf .device/stage
  echo "bundle $((bundle >> 20)) MiB + tracked files $((tracked >> 20)) MiB of the carry's 64 MiB"
  if [ $((bundle + tracked)) -gt $((64 << 20)) ]; then
    echo "too large for the device tool's carry: move untracked or large test data out of the tree for the run" >&2
    exit 1
  fi
  ;;
check)
  command -v nvcc >/dev/null || { echo "no nvcc here (Debian: apt install nvidia-cuda-toolkit from non-free)" >&2; exit 1; }
  nvcc --version | tail -1
  # The front end only (C++ and the CUDA language); 1556: an extern __shared__
  # array of each kernel family shares its name with the others', as intended.
  nvcc -std=c++17 -ptx -arch=compute_90 -diag-suppress 1556 -o /dev/null kernels/manifold.cu
  echo "kernels/manifold.cu and its headers compile to PTX"
  nvcc -std=c++17 -ptx -arch=compute_90 -diag-suppress 1556 -DMANIFOLD_DEV -o /dev/null kernels/manifold.cu
  echo "... and with -DMANIFOLD_DEV (the dev image)"
  ;;
run)
  out="${OUT:-/tmp/gpu-out}"; mkdir -p "$out"
  export MANIFOLD_GOLDEN_DIR="$PWD/.device/golden"
  unpack
  if [ "${REBUILD:-}" = 1 ]; then
    # Kernel development: build the image here and run the binaries with it.
    kernels/build.sh && cp kernels/manifold.fatbin kernels/manifold.fatbin.sum "$out/"
    export MANIFOLD_KERNEL_IMAGE="$PWD/kernels/manifold.fatbin"
  fi
  if [ "${DEV:-}" = 1 ]; then
    # The dev build's experiments (binaries from "prepare dev"): the dev image.
    kernels/build.sh dev
    export MANIFOLD_KERNEL_IMAGE="$PWD/kernels/manifold-dev.fatbin"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  status=0
  (cd kernels && ../.device/kernels.test -test.count=1 -test.v 2>&1 | grep -v '^=== ' | tee "$out/kernels-test.log" | grep -E '^(--- |FAIL|PASS|ok)' ) || status=1
  (cd engine && ../.device/engine.test -test.count=1 2>&1 | tail -5) || status=1
  if [ "${2:-}" = "bench" ]; then
    (cd kernels && ../.device/kernels.test -test.run '^$' -test.bench GEMV -test.benchtime 1x 2>&1 | grep RESULT | tee "$out/gemv.log")
    (cd kernels && ../.device/kernels.test -test.run '^$' -test.bench 'BF16GEMM|BF16Block' -test.benchtime 1x 2>&1 | grep RESULT | tee "$out/bf16gemm.log")
    (cd kernels && ../.device/kernels.test -test.run '^$' -test.bench 'CuBLASGEMM' -test.benchtime 1x 2>&1 | grep RESULT | tee "$out/cublas.log")
    python3 dev/torch/bench_torch.py 2>&1 | tee "$out/torch.log"
    (cd engine && MANIFOLD_BENCH_DIR=/tmp/llama8b ../.device/engine.test -test.run '^$' -test.bench DecodeLlama8B -test.benchtime 1x 2>&1 | grep -v '^goos\|^goarch\|^pkg\|^cpu' | tee "$out/decode.log")
  fi
  exit $status
  ;;
*)
  echo "usage: kernels/gpu.sh prepare [dev]|check|run [bench]" >&2; exit 2
  ;;
esac
