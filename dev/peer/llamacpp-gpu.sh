#!/usr/bin/env bash
# llamacpp-gpu.sh: llama.cpp (built from source on the GPU machine, CUDA)
# against Manifold's CUDA backend on issue 57's dense shapes, alternating
# the two programs shape by shape: Q4_0 (bf16 head) against NVFP4 (bf16
# head), and BF16 against bf16. Random weights on both sides (the same
# shapes, not the same values: speed depends only on the shape).
#
#   dev/peer/llamacpp-gpu.sh [-w WORK] [-r 3] [-b DIR] [-s BUNDLE] [-k] [SHAPE ...]
#
#   -w WORK  folder for llama.cpp's source and build and the models
#            (default ./peer-work-gpu); reused when it holds them already
#   -r N     repetitions of each test (default 3)
#   -b DIR   prebuilt `bench` and `mkgguf` (CGO_ENABLED=0 go build -o DIR/
#            ./cmd/bench ./dev/peer/mkgguf; the device has no Go)
#   -s FILE  llama.cpp's source as a git bundle (node-llama-cpp's
#            llama/gitRelease.bundle; the device has no network)
#   -k       keep each shape's models after its run (default: delete them,
#            so that the device's disk holds one shape at a time)
#   SHAPE    cmd/bench -random names (default: issue 57's matrix below)
#
# For each shape: mkgguf writes the F16 GGUF, llama-quantize makes Q4_0 with
# a bf16 output tensor and a BF16 copy; cmd/bench -random writes NAME (NVFP4)
# and NAME-bf16; then llama-bench -ngl 99 -fa 1 -p 512 -n 256 and
# bench -device cuda -p 512 -n 256 run alternately, Q4_0 | NVFP4 then
# BF16 | bf16. The shapes with more bytes than the GPU holds in bf16 are
# run in 4-bit only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=./peer-work-gpu reps=3 bin= bundle= keep=
while getopts "w:r:b:s:k" o; do
	case $o in
	w) work=$OPTARG ;; r) reps=$OPTARG ;; b) bin=$(cd "$OPTARG" && pwd) ;; k) keep=1 ;;
	s) bundle=$(cd "$(dirname "$OPTARG")" && pwd)/$(basename "$OPTARG") ;;
	*) sed -n 2,27p "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
shapes=${*:-qwen3-0.6b qwen3-1.7b qwen3-4b qwen3-8b qwen3-14b qwen3-32b llama3.2-1b llama3.2-3b llama3-8b mistral-7b llama3.1-70b-20l}
mkdir -p "$work" && work=$(cd "$work" && pwd)
lc=$work/llama.cpp models=$work/models
mkdir -p "$models"

. "$here/llamacpp.sh"
llamacpp_build "$work" "$bundle" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
echo "llama.cpp: $(git -C "$lc" log --oneline -1); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bin=$(manifold_bins "$repo" "$work" "$bin")
mb=$bin/bench

# mkgguf's flags for each shape (as internal/testmodel/dense_shapes.go and shapes.go).
gguf_flags() {
	case $1 in
	qwen3-0.6b) echo "-arch qwen3 -layers 28 -hidden 1024 -ffn 3072 -heads 16 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	qwen3-1.7b) echo "-arch qwen3 -layers 28 -hidden 2048 -ffn 6144 -heads 16 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	qwen3-4b) echo "-arch qwen3 -layers 36 -hidden 2560 -ffn 9728 -heads 32 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	qwen3-8b) echo "-arch qwen3 -layers 36 -hidden 4096 -ffn 12288 -heads 32 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	qwen3-14b) echo "-arch qwen3 -layers 40 -hidden 5120 -ffn 17408 -heads 40 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	qwen3-32b) echo "-arch qwen3 -layers 64 -hidden 5120 -ffn 25600 -heads 64 -kv-heads 8 -head-dim 128 -vocab 151936 -theta 1e6" ;;
	llama3.2-1b) echo "-layers 16 -hidden 2048 -ffn 8192 -heads 32 -kv-heads 8 -vocab 128256" ;;
	llama3.2-3b) echo "-layers 28 -hidden 3072 -ffn 8192 -heads 24 -kv-heads 8 -vocab 128256" ;;
	llama3-8b) echo "-layers 32 -hidden 4096 -ffn 14336 -heads 32 -kv-heads 8 -vocab 128256" ;;
	mistral-7b) echo "-layers 32 -hidden 4096 -ffn 14336 -heads 32 -kv-heads 8 -vocab 32768 -theta 1e6" ;;
	llama3.1-70b-20l) echo "-layers 20 -hidden 8192 -ffn 28672 -heads 64 -kv-heads 8 -vocab 128256" ;;
	*) return 1 ;;
	esac
}
# bf16 runs only where the bf16 checkpoint fits the GPU with room to spare.
gpu_bytes=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1024 * 1024))

lbench() { "$lc/build/bin/llama-bench" -m "$1" -ngl 99 -fa 1 -p 512 -n 256 -r "$reps" -o md 2>/dev/null | grep -E '^\| .*(pp|tg)'; }
# Manifold's tg256 decodes from an empty context, as llama-bench's does.
mbench() {
	"$mb" -model "$1" -device cuda -p 512 -n 0 -r "$reps" 2>/dev/null | grep -E '^\| .*pp'
	"$mb" -model "$1" -device cuda -p 0 -n 256 -r "$reps" 2>/dev/null | grep -E '^\||^copy'
}
for s in $shapes; do
	flags=$(gguf_flags "$s") || { echo "unknown shape $s (see gguf_flags)" >&2; exit 2; }
	f16=$models/$s-f16.gguf q40=$models/$s-q4_0.gguf b16=$models/$s-bf16.gguf
	# Written under temporary names and renamed: a run cut short leaves no partial model.
	[ -f "$f16" ] || { "$bin/mkgguf" -o "$f16.tmp" $flags && mv "$f16.tmp" "$f16"; }
	[ -f "$q40" ] || { "$lc/build/bin/llama-quantize" --output-tensor-type bf16 "$f16" "$q40.tmp" Q4_0 >/dev/null 2>&1 && mv "$q40.tmp" "$q40"; }
	"$mb" -random "$s" -keep "$models/$s" -p 0 -n 1 -r 1 -warmup=false -copy-mib 64 >/dev/null 2>&1
	echo "== $s: llama.cpp Q4_0 (bf16 head) | Manifold NVFP4 (bf16 head)"
	lbench "$q40"
	mbench "$models/$s"
	if [ $(($(stat -c %s "$f16") * 10 / 8)) -lt "$gpu_bytes" ]; then
		[ -f "$b16" ] || { "$lc/build/bin/llama-quantize" "$f16" "$b16.tmp" BF16 >/dev/null 2>&1 && mv "$b16.tmp" "$b16"; }
		"$mb" -random "$s-bf16" -keep "$models/$s-bf16" -p 0 -n 1 -r 1 -warmup=false -copy-mib 64 >/dev/null 2>&1
		echo "== $s: llama.cpp BF16 | Manifold bf16"
		lbench "$b16"
		mbench "$models/$s-bf16"
	fi
	[ -n "$keep" ] || rm -rf "$f16" "$q40" "$b16" "$models/$s" "$models/$s-bf16"
done
