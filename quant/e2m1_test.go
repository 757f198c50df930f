package quant

import (
	"math"
	"testing"
)

// TestE2M1NearestEven checks the encoder against a brute-force search over
// the 8 magnitudes on a dense sweep of [0, 8]: nearest value, ties to the
// code with mantissa bit 0.
func TestE2M1NearestEven(t *testing.T) {
	ref := func(a float32) uint8 {
		best, bestD := uint8(0), math.Inf(1)
		for c := range uint8(8) {
			d := math.Abs(float64(a) - float64(e2m1Values[c]))
			if d < bestD || (d == bestD && c&1 == 0) {
				best, bestD = c, d
			}
		}
		return best
	}
	for i := 0; i <= 8*4096; i++ {
		a := float32(i) / 4096
		for _, v := range []float32{a, math.Nextafter32(a, 0), math.Nextafter32(a, 9)} {
			if got, want := Float32ToE2M1(v), ref(v); got != want {
				t.Fatalf("Float32ToE2M1(%v) = %#x, want %#x", v, got, want)
			}
			if got, want := Float32ToE2M1(-v), ref(v)|0x8; got != want {
				t.Fatalf("Float32ToE2M1(%v) = %#x, want %#x", -v, got, want)
			}
		}
	}
}

func TestE2M1PackOrder(t *testing.T) {
	// Even element in the low nibble, as ModelOpt and cvt.rn.satfinite.e2m1x2 pack.
	if got := PackE2M1(0x1, 0x7); got != 0x71 {
		t.Errorf("PackE2M1(1, 7) = %#x, want 0x71", got)
	}
	src := []float32{0.5, 6, -1, 3}
	dst := make([]byte, 2)
	EncodeE2M1(dst, src)
	if dst[0] != 0x71 || dst[1] != 0x5a {
		t.Errorf("EncodeE2M1(%v) = %#x, want [0x71 0x5a]", src, dst)
	}
	back := make([]float32, 4)
	DecodeE2M1(back, dst)
	for i := range src {
		if back[i] != src[i] {
			t.Errorf("DecodeE2M1: element %d = %v, want %v", i, back[i], src[i])
		}
	}
}
