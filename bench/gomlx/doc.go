// Package gomlxbench measures GoMLX's pure-Go backend ("go", package
// github.com/gomlx/gomlx/backends/simplego) against Manifold's own CPU
// backend (backend/cpu) on decode-shaped work: the batch-1 matvec, one Llama
// decoder layer's decode step, and a whole 12-layer decode token.
//
// It is a separate module so that GoMLX never enters the engine's go.mod: it
// exists only to produce the figures recorded in docs/DECISIONS.md. Run it
// with
//
//	cd bench/gomlx && go test -bench . -benchtime 10x
//
// The package owns nothing but its benchmarks; it must not be imported.
package gomlxbench
