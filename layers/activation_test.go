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
