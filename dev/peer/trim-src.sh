#!/usr/bin/env bash
# trim-src.sh LLAMA_CPP_CHECKOUT OUT.tar.xz: llama.cpp's tracked sources that
# a CPU or CUDA build of llama-bench and llama-quantize needs (no other GPU
# backends, docs, examples, tests, models, web UI or Python), xz'd: 3.6 MB for
# de3ff81 against the 35 MB git bundle, so that it fits the device tool's carry
# beside the repository. llamacpp.sh's BUNDLE takes it (-s OUT.tar.xz).
set -euo pipefail
src=$1 out=$2
git -C "$src" ls-files -z | grep -z -v -E '^(tools/ui|tools/server/public|ggml/src/ggml-(cann|openvino|webgpu|et|metal|hexagon|sycl|vulkan|opencl|hip|musa|zdnn|zendnn|virtgpu|blas|rpc)/|docs/|examples/|tests/|models/|media/|gguf-py/|scripts/|ci/|benches/|app/|conversion/|pocs/|skills/|licenses/|requirements|\.github/|grammars/|.*\.py$)' |
	tar -C "$src" --null -T - -cf - | xz -6 -T2 > "$out"
ls -l "$out"
