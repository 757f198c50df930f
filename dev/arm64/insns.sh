#!/usr/bin/env bash
# insns.sh: static instruction counts of the NEON kernels' inner loops, read
# from an arm64 binary of backend/cpu (GOARCH=arm64 go test -c). Under qemu
# the kernels' timings mean nothing; the instructions an iteration issues,
# per weight x token product, are what this machine can say about them.
#
#   dev/arm64/insns.sh BINARY
set -euo pipefail
bin=${1:?usage: insns.sh BINARY}
# kernel, products (weight x token multiply-adds) per iteration of its
# innermost backward loop, what an iteration covers.
kernels=(
	"dot4Q8SDOT 512 NVFP4 decode: 4 rows x 128 weights (256+32 bytes), 1 token"
	"dot4Q8NEON 512 NVFP4 decode without SDOT"
	"row4Q8SDOT 512 NVFP4 prefill: 1 row x 128 weights (64+8 bytes), 4 tokens"
	"row4Q8NEON 512 NVFP4 prefill without SDOT"
	"dotF32NEON 16 f32 dot product, 64 weight bytes"
	"dotBF16NEON 16 bf16 dot product, 32 weight bytes"
	"dot4BF16NEON 32 bf16 matvec: 4 rows x 8 weights (64 bytes), 1 token"
	"dot4x3F32 96 f32 prefill tile: 4 rows x 8 weights, 3 tokens"
	"dot4x3BF16 96 bf16 prefill tile: 4 rows x 8 weights, 3 tokens"
	"scores4Kernel 32 attention scores: 4 query heads x 8 columns of a key"
	"values4Kernel 64 attention values: 4 heads x 16 columns of a value row"
	"axpyF32NEON 16 axpy: 16 floats"
	"ropeDotNEON 4 htree rotary dot: 4 pairs"
)
printf '%-16s %6s %9s %10s  %s\n' kernel insns products insns/prod iteration
for k in "${kernels[@]}"; do
	read -r name prods what <<<"$k"
	# The first backward branch's distance (in instructions): "BNE -22(PC)"
	# is a loop of 23 instructions with the branch.
	n=$(go tool objdump -s "cpu\\.$name\\.abi0" "$bin" | grep -oE '(B|BNE|JMP|BLT|BGE) -[0-9]+\(PC\)' | head -1 | grep -oE '[0-9]+' || true)
	if [[ -z $n ]]; then
		echo "insns.sh: no loop found in $name" >&2
		continue
	fi
	printf '%-16s %6d %9d %10.3f  %s\n' "$name" $((n + 1)) "$prods" "$(echo "($n + 1) / $prods" | bc -l)" "$what"
done
