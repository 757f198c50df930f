#!/usr/bin/env bash
# Builds manifold.fatbin from manifold.cu with nvcc (sm_90 machine code plus
# compute_90 PTX, which newer GPUs compile at load) and records the sources'
# hash (manifold.cu, every *.cuh, build.sh) in manifold.fatbin.sum, which
# image_test.go checks. Run it where nvcc
# is (the device machine), then commit both files.
set -euo pipefail
cd "$(dirname "$0")"
# The sources the image is built from, in the order image_test.go hashes them.
sources() { echo manifold.cu; LC_ALL=C ls *.cuh 2>/dev/null; echo build.sh; }
nvcc --version | tail -1
nvcc -O3 -std=c++17 -fatbin \
  -gencode arch=compute_90,code=sm_90 \
  -gencode arch=compute_90,code=compute_90 \
  -Xptxas -v \
  -o manifold.fatbin manifold.cu 2> ptxas.log || { cat ptxas.log; exit 1; }
grep -E "registers|spill" ptxas.log | head -40 || true
rm -f ptxas.log
sha256sum $(sources) | sha256sum | cut -d' ' -f1 > manifold.fatbin.sum
echo "built manifold.fatbin ($(stat -c %s manifold.fatbin) bytes), sources $(cat manifold.fatbin.sum)"
