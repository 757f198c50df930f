// Package stcompare benchmarks package weights against
// github.com/nlpodyssey/safetensors. It is a separate module so that the
// main module does not depend on the package it decided not to use; run it
// with `cd weights/internal/stcompare && go mod tidy && go test -bench .`
// (tidy picks up dependencies the main module gained since).
package stcompare
