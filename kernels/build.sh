#!/usr/bin/env bash
# Builds manifold.fatbin from manifold.cu with nvcc (sm_90 machine code plus
# compute_90 PTX, which newer GPUs compile at load) and records the sources'
# hash (manifold.cu, every *.cuh, build.sh) in manifold.fatbin.sum, which
# image_test.go checks. Run it where nvcc
# is (the device machine), then commit both files.
#   kernels/build.sh       the production image, embedded in the binary
#   kernels/build.sh dev   the dev image, kernels/manifold-dev.fatbin (git-ignored,
#                          never embedded): the same sources with -DMANIFOLD_DEV,
#                          which adds the experiments' kernels, the tracing
#                          instances and the ablation branches; run the dev
#                          build with MANIFOLD_KERNEL_IMAGE naming it (dev/README.md)
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
"") out=manifold.fatbin def="" ;;
dev) out=manifold-dev.fatbin def="-DMANIFOLD_DEV" ;;
*) echo "usage: kernels/build.sh [dev]" >&2; exit 2 ;;
esac
# The sources the image is built from, in the order image_test.go hashes them.
sources() { echo manifold.cu; LC_ALL=C ls *.cuh 2>/dev/null; echo build.sh; }
nvcc --version | tail -1
nvcc -O3 -std=c++17 -fatbin $def \
  -gencode arch=compute_90,code=sm_90 \
  -gencode arch=compute_90,code=compute_90 \
  -Xptxas -v \
  -o "$out" manifold.cu 2> ptxas.log || { cat ptxas.log; exit 1; }
grep -E "registers|spill" ptxas.log | head -40 || true
rm -f ptxas.log
if [ -z "$def" ]; then
  sha256sum $(sources) | sha256sum | cut -d' ' -f1 > manifold.fatbin.sum
  echo "built manifold.fatbin ($(stat -c %s manifold.fatbin) bytes), sources $(cat manifold.fatbin.sum)"
else
  echo "built $out ($(stat -c %s "$out") bytes): the dev image, not committed"
fi
