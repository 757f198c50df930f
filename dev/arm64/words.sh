#!/usr/bin/env bash
# words.sh: the NEON instructions Go's arm64 assembler has no mnemonic for
# (SDOT, SMULL, SMLAL2, SADDLP, SCVTF, FMUL, FADD, FADDP, ...) are written in
# backend/cpu/*_arm64.s (and the macros of backend/cpu/*_arm64.h) as
#
#     WORD $0x4e8b9620 /* sdot v0.4s, v17.16b, v11.16b */
#
# This script assembles each comment with GNU as (aarch64-linux-gnu-as,
# Debian's binutils-aarch64-linux-gnu) and checks that the word is its
# encoding; with -w it rewrites the words instead (write $0x0 for a new one).
#
#   dev/arm64/words.sh [-w] [FILE.s ...]   (default: backend/cpu/*_arm64.s and *_arm64.h)
set -euo pipefail
cd "$(dirname "$0")/../.."
write=0
if [[ ${1:-} == -w ]]; then write=1; shift; fi
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(backend/cpu/*_arm64.s backend/cpu/*_arm64.h)
AS=${AS:-aarch64-linux-gnu-as}
OBJDUMP=${OBJDUMP:-aarch64-linux-gnu-objdump}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
re='WORD \$0x[0-9a-fA-F]+ /\* ([^*]+) \*/'
bad=0
for f in "${files[@]}"; do
	if grep -nE 'WORD \$0x[0-9a-fA-F]+' "$f" | grep -vE "$re" >&2; then
		echo "$f: a WORD above has no /* instruction */ comment" >&2
		bad=1
	fi
	grep -oE "$re" "$f" | sed -E "s#$re#\1#" | sort -u >"$tmp/insns" || true
	[[ -s $tmp/insns ]] || continue
	$AS -march=armv8.2-a+dotprod -o "$tmp/o" "$tmp/insns"
	# objdump -d: "   0:	4e8b9620 	sdot	v0.4s, ..."; line i is instruction i.
	$OBJDUMP -d "$tmp/o" | awk -F'\t' '/^ *[0-9a-f]+:\t/ {print $2}' | tr -d ' ' >"$tmp/words"
	paste -d'|' "$tmp/insns" "$tmp/words" >"$tmp/map"
	while IFS='|' read -r insn word; do
		if [[ $write == 1 ]]; then
			esc=$(printf '%s' "$insn" | sed 's/[.[\*^$/]/\\&/g')
			sed -i -E "s/WORD \\\$0x[0-9a-fA-F]+ \/\* $esc \*\//WORD \$0x$word \/* $insn *\//g" "$f"
		else
			while read -r have; do
				if [[ ${have,,} != "$word" ]]; then
					echo "$f: $insn: WORD \$0x$have, want \$0x$word" >&2
					bad=1
				fi
			done < <(grep -oE "WORD \\\$0x[0-9a-fA-F]+ /\\* $(printf '%s' "$insn" | sed 's/[.[\*^$]/\\&/g') \\*/" "$f" | sed -E 's/WORD \$0x([0-9a-fA-F]+).*/\1/')
		fi
	done <"$tmp/map"
done
[[ $bad == 0 ]] && echo "words.sh: ok"
exit $bad
