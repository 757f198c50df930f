//go:build !amd64 && !arm64

package cpu

func dotF32(x, w []float32) float32           { return dotF32Go(x, w) }
func dotBF16(x []float32, w []uint16) float32 { return dotBF16Go(x, w) }
