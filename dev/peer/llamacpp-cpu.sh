#!/usr/bin/env bash
# llamacpp-cpu.sh: llama.cpp (built from source here, CPU only) against
# Manifold's CPU backend on issue 61's shape (16 layers, hidden 2048, FFN
# 8192, GQA 32/8, vocab 32000, untied head, random weights), alternating the
# two programs run by run at each thread count.
#
#   dev/peer/llamacpp-cpu.sh [-w WORK] [-t "2"] [-r 3] [-b DIR] [-s BUNDLE]
#
#   -w WORK  folder for llama.cpp's source, build and the models (default
#            ./peer-work); reused when it holds them already
#   -t LIST  thread counts, e.g. "1 2 4 8 16" (default: all cores)
#   -r N     repetitions of each test inside each program run (default 3)
#   -b DIR   a folder holding prebuilt binaries `bench` and `mkgguf`
#            (CGO_ENABLED=0 go build -o DIR/ ./cmd/bench ./dev/peer/mkgguf);
#            default: go build them from this checkout
#   -s FILE  llama.cpp's source as a git bundle (node-llama-cpp's
#            llama/gitRelease.bundle), for a machine without npm access
#
# What it does:
#  1. llama.cpp's source: the release that the npm package node-llama-cpp
#     ships as llama/gitRelease.bundle (npm pack, then git clone of the
#     bundle; or -s), unless WORK/llama.cpp exists;
#  2. cmake Release build with GGML_NATIVE=ON, no CUDA/Metal/BLAS, of
#     llama-bench and llama-quantize;
#  3. the peer models: dev/peer/mkgguf writes a random F16 GGUF of the
#     shape (convert_hf_to_gguf.py needs transformers and a tokenizer, and
#     gguf-py numpy: not installable here),
#     llama-quantize makes Q4_0 with a bf16 output tensor (the head);
#  4. Manifold's random checkpoints of the same shape: bench -random
#     llama-1b-32k (NVFP4 linears, bf16 head) and llama-1b-32k-bf16;
#  5. for each thread count and each pair: llama-bench (pp64, pp512,
#     tg128), then Manifold's bench (pp64; pp512 and tg128), alternately:
#     F16 vs bf16, then Q4_0 vs NVFP4.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=./peer-work threads=$(nproc) reps=3 bin= bundle=
while getopts "w:t:r:b:s:" o; do
	case $o in
	w) work=$OPTARG ;; t) threads=$OPTARG ;; r) reps=$OPTARG ;; b) bin=$(cd "$OPTARG" && pwd) ;;
	s) bundle=$(cd "$(dirname "$OPTARG")" && pwd)/$(basename "$OPTARG") ;;
	*) sed -n 2,30p "$0"; exit 2 ;;
	esac
done
mkdir -p "$work" && work=$(cd "$work" && pwd)
lc=$work/llama.cpp models=$work/models
mkdir -p "$models"

. "$here/llamacpp.sh"
llamacpp_build "$work" "$bundle" -DGGML_NATIVE=ON -DGGML_CUDA=OFF
echo "llama.cpp: $(git -C "$lc" log --oneline -1)"

bin=$(manifold_bins "$repo" "$work" "$bin")
mb=$bin/bench
f16=$models/l1b32k-f16.gguf q40=$models/l1b32k-q4_0-bf16head.gguf
# Written under a temporary name and renamed, so that a run cut short leaves no partial model behind.
[ -f "$f16" ] || { "$bin/mkgguf" -o "$f16.tmp" && mv "$f16.tmp" "$f16"; }
[ -f "$q40" ] || { "$lc/build/bin/llama-quantize" --output-tensor-type bf16 "$f16" "$q40.tmp" Q4_0 >/dev/null 2>&1 &&
	mv "$q40.tmp" "$q40"; }
# Write the checkpoints once (-p 0 -n 1 -r 1: a minimal run).
for s in llama-1b-32k llama-1b-32k-bf16; do
	"$mb" -random $s -keep "$models/$s" -p 0 -n 1 -r 1 -warmup=false -copy-mib 64 >/dev/null 2>&1
done

lbench() { "$lc/build/bin/llama-bench" -m "$1" -p 64,512 -n 128 -t "$2" -r "$reps" -o md 2>/dev/null | grep -E '^\|'; }
# Manifold's tg128 decodes from an empty context, as llama-bench's does
# (after the 512-token prompt it would attend over 512-640 positions).
mbench() {
	"$mb" -model "$1" -p 64 -n 0 -threads "$2" -r "$reps" -copy-mib 256 2>/dev/null | grep -E '^\| .*pp'
	"$mb" -model "$1" -p 512 -n 0 -threads "$2" -r "$reps" -copy-mib 256 2>/dev/null | grep -E '^\| .*pp'
	"$mb" -model "$1" -p 0 -n 128 -threads "$2" -r "$reps" -copy-mib 256 2>/dev/null | grep -E '^\||^copy'
}
for t in $threads; do
	echo "== $t threads: llama.cpp F16 | Manifold bf16"
	lbench "$f16" "$t"
	mbench "$models/llama-1b-32k-bf16" "$t"
	echo "== $t threads: llama.cpp Q4_0 (bf16 head) | Manifold NVFP4 (bf16 head)"
	lbench "$q40" "$t"
	mbench "$models/llama-1b-32k" "$t"
done
