package layers

import (
	"math"
	"testing"
)

func TestLogSumExp(t *testing.T) {
	for _, c := range []struct {
		z    []float32
		want float64
	}{
		{[]float32{0}, 0},
		{[]float32{0, 0}, math.Ln2},
		{[]float32{1000, 1000}, 1000 + math.Ln2}, // no overflow
		{[]float32{-1, 2, 0.5}, math.Log(math.Exp(-1) + math.Exp(2) + math.Exp(0.5))},
		{nil, math.Inf(-1)},
	} {
		if got := LogSumExp(c.z); math.Abs(got-c.want) > 1e-12 && got != c.want {
			t.Errorf("LogSumExp(%v) = %v, want %v", c.z, got, c.want)
		}
	}
}

func TestArgmax(t *testing.T) {
	for _, c := range []struct {
		x    []float32
		want int
	}{
		{nil, 0},
		{[]float32{3}, 0},
		{[]float32{1, 5, 2}, 1},
		{[]float32{4, 4, 1}, 0}, // the first of equal maxima
		{[]float32{-2, -1, float32(math.Inf(-1))}, 1},
	} {
		if got := Argmax(c.x); got != c.want {
			t.Errorf("Argmax(%v) = %d, want %d", c.x, got, c.want)
		}
	}
}
