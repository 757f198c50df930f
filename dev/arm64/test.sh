#!/usr/bin/env bash
# test.sh: the CPU backend's arm64 NEON kernels (backend/cpu/*_arm64.s)
# tested on an amd64 machine under qemu-user (Debian: apt-get install
# qemu-user-static; binutils-aarch64-linux-gnu for words.sh).
#
#   dev/arm64/test.sh [-a] [-b]
#
#   -a  all of backend/cpu's tests, not only the kernels' (TestConformance
#       runs the whole op table through pure-Go attention under emulation:
#       tens of minutes)
#   -b  also run BenchmarkQ8Kernels once on each emulated processor (a
#       smoke test: under qemu the timings mean nothing; neon=true is the
#       SMULL kernel forced, neon=false the one the processor picks) and
#       print the kernels' static instruction counts (insns.sh)
#
# What it does:
#  1. dev/arm64/words.sh: the WORD-encoded instructions match GNU as;
#  2. GOARCH=arm64 go vet ./backend/cpu, GOOS=darwin GOARCH=arm64 go build
#     ./... (Apple: x/sys/cpu reads the dot product from sysctl there);
#  3. GOARCH=arm64 go test -c of backend/cpu, run under qemu-aarch64 twice:
#     -cpu max (has SDOT: the SDOT kernels and, through the test hook
#     q8ForceBase, the SMULL ones) and -cpu cortex-a53 (ARMv8.0, no SDOT:
#     the SMULL kernels the processor picks itself).
set -euo pipefail
cd "$(dirname "$0")/../.."
all=0 bench=0
while getopts ab o; do
	case $o in
	a) all=1 ;;
	b) bench=1 ;;
	*) sed -n '2,/^set/p' "$0" | sed '$d' >&2; exit 2 ;;
	esac
done
QEMU=${QEMU:-$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)}
[[ -n $QEMU ]] || { echo "test.sh: no qemu-aarch64 (apt-get install qemu-user-static)" >&2; exit 1; }
export MANIFOLD_GOLDEN_DIR=${MANIFOLD_GOLDEN_DIR:-$PWD/../shared/golden}

if command -v aarch64-linux-gnu-as >/dev/null; then
	dev/arm64/words.sh
else
	echo "test.sh: no aarch64-linux-gnu-as, WORD encodings not checked" >&2
fi
GOARCH=arm64 go vet ./backend/cpu
GOOS=darwin GOARCH=arm64 go build ./...

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$tmp/cpu.arm64" ./backend/cpu
run='TestQ8|TestFloatKernels|TestDotFallback|TestMatMul|TestAttn4|TestAxpy|TestRoPEDot'
[[ $all == 1 ]] && run=.
status=0
for cpu in max cortex-a53; do
	echo "== qemu-aarch64 -cpu $cpu: -test.run '$run'"
	(cd backend/cpu && "$QEMU" -cpu "$cpu" "$tmp/cpu.arm64" -test.run "$run" -test.timeout 60m) || status=1
	if [[ $bench == 1 ]]; then
		(cd backend/cpu && "$QEMU" -cpu "$cpu" "$tmp/cpu.arm64" -test.run '^$' -test.bench 'BenchmarkQ8Kernels' -test.benchtime 1x) || status=1
	fi
done
if [[ $bench == 1 ]]; then
	dev/arm64/insns.sh "$tmp/cpu.arm64"
fi
exit $status
