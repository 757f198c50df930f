#!/bin/bash
# The GPU load test of cmd/serve (issue 60). Build here (no cgo), carry
# .device/serve to the device, run this there from the repository root:
#
#   CGO_ENABLED=0 go build -o .device/serve/serve ./cmd/serve
#   CGO_ENABLED=0 go build -o .device/serve/serveload ./dev/serveload
#   CGO_ENABLED=0 go build -o .device/serve/bench ./cmd/bench
#   bash dev/serveload/gpu.sh
#
# It writes a random Llama-3.2-1B-shape NVFP4 checkpoint (no tokenizer: the
# requests are token ids), serves it batched over the paged KV cache (the
# default), batched with a cache a session (-block-size -1) and with
# -no-batch in turn, and prints for each the output tokens/s, mean batch,
# p50/p99 time to first token and inter-token latency at 1, 8, 32 and 64
# concurrent streams (MODES picks and orders the modes).
# A dry run on the CPU: DEVICE=cpu SHAPE=tiny-llama CLIENTS=1,4 MAX_TOKENS=8.
set -euo pipefail
B=.device/serve
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-llama3.2-1b}
DIR=${MODEL_DIR:-/tmp/serve-$SHAPE}
$B/bench -random "$SHAPE" -keep "$DIR" -device "$DEVICE" -p 8 -n 8 -r 1 -warmup=false >/dev/null
for mode in ${MODES:-paged unpaged no-batch paged unpaged no-batch}; do
	extra=()
	[ "$mode" = unpaged ] && extra=(-block-size -1)
	[ "$mode" = no-batch ] && extra=(-no-batch)
	$B/serve -model "$DIR" -device "$DEVICE" -addr 127.0.0.1:18080 -sessions 64 -ctx 512 "${extra[@]}" 2>"$B/serve-$mode.log" &
	pid=$!
	trap 'kill -INT $pid 2>/dev/null || true' EXIT
	for _ in $(seq 300); do curl -sf 127.0.0.1:18080/health >/dev/null && break; sleep 0.2; done
	echo "== $mode"
	$B/serveload -url http://127.0.0.1:18080 -ids -prompt-words 64 -max-tokens "${MAX_TOKENS:-128}" -requests 2 -clients "${CLIENTS:-1,8,32,64}" || echo "serveload: incomplete requests (above)"
	kill -INT $pid
	wait $pid
done
