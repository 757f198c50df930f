//go:build !amd64 && !arm64

package cpu

func axpyF32(y, x []float32, a float32) { axpyF32Go(y, x, a) }
