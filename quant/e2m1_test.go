package quant

import (
	"math"
	"testing"
)

func TestE2M1EveryCodeRoundTrips(t *testing.T) {
	for c := range uint8(16) {
		v := E2M1ToFloat32(c)
		if got := Float32ToE2M1(v); got != c {
			t.Errorf("code %#x = %v encodes back to %#x", c, v, got)
		}
	}
}

func TestE2M1Rounding(t *testing.T) {
	below := func(f float32) float32 { return math.Nextafter32(f, 0) }
	above := func(f float32) float32 { return math.Nextafter32(f, 100) }
	tests := []struct {
		name string
		in   float32
		want uint8
	}{
		{"zero", 0, 0x0},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8},
		{"tie 0.25 to 0", 0.25, 0x0},
		{"above 0.25", above(0.25), 0x1},
		{"tie 0.75 to 1.0", 0.75, 0x2},
		{"below 0.75", below(0.75), 0x1},
		{"tie 1.25 to 1.0", 1.25, 0x2},
		{"above 1.25", above(1.25), 0x3},
		{"tie 1.75 to 2.0", 1.75, 0x4},
		{"below 1.75", below(1.75), 0x3},
		{"tie 2.5 to 2.0", 2.5, 0x4},
		{"above 2.5", above(2.5), 0x5},
		{"tie 3.5 to 4.0", 3.5, 0x6},
		{"below 3.5", below(3.5), 0x5},
		{"tie 5 to 4", 5, 0x6},
		{"above 5", above(5), 0x7},
		{"negative tie -0.75", -0.75, 0xa},
		{"negative tie -5", -5, 0xe},
		{"small negative is -0", -0.1, 0x8},
		{"saturate 6", 6, 0x7},
		{"saturate 7", 7, 0x7},
		{"saturate 1e30", 1e30, 0x7},
		{"saturate -6.5", -6.5, 0xf},
		{"saturate +Inf", float32(math.Inf(1)), 0x7},
		{"saturate -Inf", float32(math.Inf(-1)), 0xf},
		{"NaN is +max", float32(math.NaN()), 0x7},
	}
	for _, tt := range tests {
		if got := Float32ToE2M1(tt.in); got != tt.want {
			t.Errorf("%s: Float32ToE2M1(%v) = %#x, want %#x", tt.name, tt.in, got, tt.want)
		}
	}
}

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

func TestE4M3EveryCodeRoundTrips(t *testing.T) {
	for c := range 256 {
		code := uint8(c)
		if code&0x7f == 0x7f { // NaN
			if v := E4M3ToFloat32(code); v == v {
				t.Errorf("code %#x decodes to %v, want NaN", code, v)
			}
			continue
		}
		v := E4M3ToFloat32(code)
		if got := Float32ToE4M3(v); got != code {
			t.Errorf("code %#02x = %v encodes back to %#02x", code, v, got)
		}
	}
}

func TestE4M3RoundingAndSaturation(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want uint8
	}{
		{"1.0", 1, 0x38},
		{"tie 1.0625 to 1.0 (even)", 1.0625, 0x38},
		{"tie 1.1875 to 1.25 (even)", 1.1875, 0x3a},
		{"subnormal tie 2^-10 to 0", 1.0 / 1024, 0x00},
		{"subnormal tie 3*2^-10 to 2*2^-9", 3.0 / 1024, 0x02},
		{"smallest subnormal", 1.0 / 512, 0x01},
		{"max 448", 448, 0x7e},
		{"416 exact", 416, 0x7d},
		{"tie 432 to 448 (even)", 432, 0x7e},
		{"saturate 464", 464, 0x7e},
		{"saturate 1e9", 1e9, 0x7e},
		{"saturate -1e9", -1e9, 0xfe},
		{"saturate +Inf", float32(math.Inf(1)), 0x7e},
		{"saturate -Inf", float32(math.Inf(-1)), 0xfe},
	}
	for _, tt := range tests {
		if got := Float32ToE4M3(tt.in); got != tt.want {
			t.Errorf("%s: Float32ToE4M3(%v) = %#02x, want %#02x", tt.name, tt.in, got, tt.want)
		}
	}
}
