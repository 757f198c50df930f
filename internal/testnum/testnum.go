// Package testnum holds the seeded random inputs and the error measures that
// the tests of the reference math share. Only tests import it.
package testnum

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// Uniform is n values uniform in [-scale, scale).
func Uniform(rng *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = (rng.Float32()*2 - 1) * scale
	}
	return x
}

// Normal is n values drawn from N(mean, std²), rounded to float32.
func Normal(rng *rand.Rand, n int, mean, std float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(mean + std*rng.NormFloat64())
	}
	return x
}

// MaxAbsDiff is max_i |a[i] - b[i]| over len(a) values, in float64.
func MaxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// NormalF32Bytes is n values drawn as Normal draws them, as little-endian
// float32 bytes (a safetensors F32 tensor's data).
func NormalF32Bytes(rng *rand.Rand, n int, mean, std float64) []byte {
	buf := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(mean+std*rng.NormFloat64())))
	}
	return buf
}
