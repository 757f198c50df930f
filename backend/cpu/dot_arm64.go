package cpu

import "golang.org/x/sys/cpu"

// hasNEON is fixed at start-up: Advanced SIMD, which every arm64 processor
// Go runs on has.
var hasNEON = cpu.ARM64.HasASIMD

func dotF32(x, w []float32) float32           { return dotF32Go(x, w) }
func dotBF16(x []float32, w []uint16) float32 { return dotBF16Go(x, w) }
