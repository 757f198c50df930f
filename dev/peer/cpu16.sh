#!/usr/bin/env bash
# cpu16.sh: issue 61 on a many-core machine without network, in one command:
# llama.cpp (prebuilt for any x86-64 CPU where carried, else built here from
# a source tarball, CPU only, GGML_NATIVE) beside Manifold's CPU backend on
# issue 61's shape, printing one table.
#
#   dev/peer/cpu16.sh [-w WORK] [-b DIR] [-p PREBUILT] [-s TARBALL] [-T "16 8"] [-S "1 2 4 8 16"] [-r 2] [-x]
#
#   -w WORK     folder for llama.cpp's build and the models (default
#               .device/peer-work); reused when it holds them already
#   -b DIR      prebuilt `bench` and `mkgguf` (default .device/cpu-peer):
#               CGO_ENABLED=0 go build -ldflags=-s -o DIR/ ./cmd/bench ./dev/peer/mkgguf
#   -p PREBUILT llama-bench and llama-quantize with every x86 CPU variant of
#               ggml, the best loaded at run time (dev/peer/prebuild-cpu.sh;
#               default DIR/llama.cpp-cpu-prebuilt.tar.xz where it exists):
#               unpacked into WORK (unless there), no build; "-p none"
#               builds from -s instead
#   -s TARBALL  llama.cpp's CPU sources (dev/peer/trim-src.sh; default
#               DIR/llama.cpp.tar.xz), built only without a prebuilt
#   -T LIST     thread counts of the full comparison (default "16 8"):
#               pp64, pp512 and tg128 at each precision, llama.cpp and
#               Manifold alternated program by program, -r repetitions
#   -S LIST     thread counts of the scaling sweep (default "1 2 4 8 16"):
#               pp64 and tg128 only, -r 1, each engine over all the
#               counts in turn (llama.cpp, then Manifold), both precisions
#   -r N        repetitions in the full comparison (default 2)
#   -x          prepare only (build llama.cpp, write the models) and stop
#
# Phases and their time on 16 cores: llama.cpp (once: unpacking the prebuilt
# takes seconds, the build from source 6-8 minutes) and the four models
# (once, about a minute; both reused by later calls), the comparison
# at 16 and 8 threads (about 3 minutes), the sweep (about 3 minutes). A
# call cut short (the device's 10-minute limit) is rerun as is: what is
# built or written is kept (models under a temporary name until whole).
# The raw outputs go to WORK/out-DATE/, the table to stdout and
# WORK/out-DATE/table.md: t/s of each engine, Manifold / llama.cpp.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$repo/.device/peer-work bin=$repo/.device/cpu-peer pre= src= full="16 8" sweep="1 2 4 8 16" reps=2 prep=
while getopts "w:b:p:s:T:S:r:x" o; do
	case $o in
	w) work=$OPTARG ;; b) bin=$OPTARG ;; p) pre=$OPTARG ;; s) src=$OPTARG ;; T) full=$OPTARG ;; S) sweep=$OPTARG ;;
	r) reps=$OPTARG ;; x) prep=1 ;;
	*) sed -n 2,36p "$0"; exit 2 ;;
	esac
done
bin=$(cd "$bin" && pwd)
if [ -z "$pre" ]; then
	pre=none
	[ ! -f "$bin/llama.cpp-cpu-prebuilt.tar.xz" ] || pre=$bin/llama.cpp-cpu-prebuilt.tar.xz
fi
if [ "$pre" != none ]; then
	[ -f "$pre" ] || { echo "cpu16.sh: no prebuilt llama.cpp at $pre" >&2; exit 2; }
	pre=$(cd "$(dirname "$pre")" && pwd)/$(basename "$pre")
fi
src=${src:-$bin/llama.cpp.tar.xz}
src=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")
mkdir -p "$work/models" && work=$(cd "$work" && pwd)
lc=$work/llama.cpp models=$work/models
out=$work/out-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*" >&2; }

# lbin: the folder of llama-bench and llama-quantize, the prebuilt's (unpacked whole under a temporary name,
# then renamed) or the build's.
if [ "$pre" != none ]; then
	lbin=$work/llama.cpp-cpu-prebuilt
	stamp "llama.cpp: unpack $(basename "$pre") (unless unpacked)"
	if [ ! -x "$lbin/llama-bench" ]; then
		rm -rf "$work/prebuilt.tmp" && mkdir -p "$work/prebuilt.tmp"
		tar -C "$work/prebuilt.tmp" -xJf "$pre"
		mv "$work/prebuilt.tmp/llama.cpp-cpu-prebuilt" "$lbin" && rm -rf "$work/prebuilt.tmp"
	fi
	# The sapphirerapids variant uses AMX, which a process must ask the kernel for; on the device host (2026-12-08)
	# ggml picked it and died of SIGILL in Q4_0's matmuls. Without it and cooperlake (removed with it in the run that
	# worked) zen4 loads there: AVX-512 with bf16 and VNNI.
	rm -f "$lbin/libggml-cpu-sapphirerapids.so" "$lbin/libggml-cpu-cooperlake.so"
else
	. "$here/llamacpp.sh"
	lbin=$lc/build/bin
	stamp "llama.cpp: build (unless built)"
	llamacpp_build "$work" "$src" -DGGML_NATIVE=ON -DGGML_CUDA=OFF
fi
f16=$models/l1b32k-f16.gguf q40=$models/l1b32k-q4_0-bf16head.gguf
stamp "models (unless written)"
[ -f "$f16" ] || { "$bin/mkgguf" -o "$f16.tmp" && mv "$f16.tmp" "$f16"; }
[ -f "$q40" ] || { "$lbin/llama-quantize" --output-tensor-type bf16 "$f16" "$q40.tmp" Q4_0 >/dev/null 2>&1 &&
	mv "$q40.tmp" "$q40"; }
for s in llama-1b-32k llama-1b-32k-bf16; do
	"$bin/bench" -random $s -keep "$models/$s" -device cpu -p 0 -n 1 -r 1 -warmup=false -copy-mib 64 >/dev/null 2>&1
done
{
	lscpu | grep -E 'Model name|^CPU\(s\)|^Thread|^Core|^Socket|^NUMA node\(s\)|L3' || true
	if [ "$pre" != none ]; then
		# The variant is the one ggml's loader chose for this CPU (its log line: "loaded CPU backend from").
		echo "llama.cpp: prebuilt $(basename "$pre"): $(head -1 "$lbin/BUILD-INFO.txt"); CPU variant loaded: $(
			"$lbin/llama-bench" --list-devices 2>&1 | sed -n 's/.*loaded CPU backend from .*libggml-cpu-\(.*\)\.so.*/\1/p' | head -1)"
	else
		echo "llama.cpp: $(git -C "$lc" log --oneline -1 2>/dev/null || echo "from $(basename "$src")")"
	fi
} | tee "$out/machine.txt" >&2
[ -z "$prep" ] || { stamp "prepared"; exit 0; }

# Each run appends "engine precision threads test t/s" lines to $out/results
# (and its raw output to $out/raw.txt): the md tables of both programs have
# the test (pp64, tg128) in one column and the t/s ("77.8 ± 0.3") in the next.
collect() { # ENGINE PRECISION THREADS
	tee -a "$out/raw.txt" | awk -F'|' -v e="$1" -v p="$2" -v t="$3" '{
		for (i = 2; i < NF; i++) if ($i ~ /^ *(pp|tg)[0-9]+ *$/) {
			test = $i; gsub(/ /, "", test); split($(i+1), v, " "); print e, p, t, test, v[1]
		}
	}' >>"$out/results"
}
lbench() { # MODEL THREADS REPS TESTS(-p.. -n..)
	local m=$1 t=$2 r=$3
	shift 3
	"$lbin/llama-bench" -m "$m" "$@" -t "$t" -r "$r" -o md 2>/dev/null
}
# Manifold's tg128 runs alone (-p 0): from an empty context, as
# llama-bench's does (after a prompt it would attend over more positions).
mbench() { # MODEL THREADS REPS P N
	"$bin/bench" -model "$1" -device cpu -p "$4" -n "$5" -threads "$2" -r "$3" -copy-mib 256 2>/dev/null
}
prec() { case $1 in bf16) echo "$f16 $models/llama-1b-32k-bf16" ;; *) echo "$q40 $models/llama-1b-32k" ;; esac; }

for t in $full; do
	for p in bf16 nvfp4; do
		read -r lm mm < <(prec $p)
		stamp "full: $t threads, $p: llama.cpp"
		lbench "$lm" "$t" "$reps" -p 64,512 -n 128 | collect llama.cpp $p "$t"
		stamp "full: $t threads, $p: Manifold"
		mbench "$mm" "$t" "$reps" 64 0 | collect manifold $p "$t"
		mbench "$mm" "$t" "$reps" 512 0 | collect manifold $p "$t"
		mbench "$mm" "$t" "$reps" 0 128 | collect manifold $p "$t"
	done
done
for p in nvfp4 bf16; do
	read -r lm mm < <(prec $p)
	stamp "sweep $p: llama.cpp at $sweep"
	for t in $sweep; do lbench "$lm" "$t" 1 -p 64 -n 128 | collect llama.cpp-sweep $p "$t"; done
	stamp "sweep $p: Manifold at $sweep"
	for t in $sweep; do
		mbench "$mm" "$t" 1 64 0 | collect manifold-sweep $p "$t"
		mbench "$mm" "$t" 1 0 128 | collect manifold-sweep $p "$t"
	done
done
stamp "done"

# The table: one row per precision, thread count and test.
awk '
	{ k = $2 " " $3 " " $4; sweep = ($1 ~ /sweep/); e = $1; sub(/-sweep/, "", e)
	  key = (sweep ? "sweep" : "full") SUBSEP k; v[key, e] = $5; if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
	END {
		print "| run | precision | threads | test | llama.cpp t/s | Manifold t/s | Manifold / llama.cpp |"
		print "|---|---|---|---|---:|---:|---:|"
		for (i = 0; i < n; i++) {
			split(order[i], a, SUBSEP); split(a[2], f, " ")
			l = v[order[i], "llama.cpp"]; m = v[order[i], "manifold"]
			r = (l > 0 && m > 0) ? sprintf("%.2f", m / l) : "-"
			printf "| %s | %s | %s | %s | %s | %s | %s |\n", a[1], (f[1] == "bf16" ? "F16 / bf16" : "Q4_0 / NVFP4"), f[2], f[3], (l == "" ? "-" : l), (m == "" ? "-" : m), r
		}
	}' "$out/results" | tee "$out/table.md"
echo "raw outputs: $out" >&2
