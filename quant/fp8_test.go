package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// e4m3Ref is a brute-force reference encoder: the nearest finite E4M3 value,
// ties to the even code, saturating to ±448.
func e4m3Ref(f float32) uint8 {
	if f != f {
		return E4M3NaN
	}
	x := float64(f)
	if x >= E4M3Max {
		return 0x7e
	}
	if x <= -E4M3Max {
		return 0xfe
	}
	best, bestD := uint8(0), math.Inf(1)
	for c := 0; c < 256; c++ {
		if c&0x7f == 0x7f {
			continue
		}
		v := float64(E4M3ToFloat32(uint8(c)))
		if math.Signbit(v) != math.Signbit(x) && v != 0 {
			continue
		}
		d := math.Abs(v - x)
		if d < bestD || (d == bestD && c&1 == 0 && best&1 == 1) {
			best, bestD = uint8(c), d
		}
	}
	if x == 0 || (best&0x7f == 0) { // keep the sign of zero
		if math.Signbit(x) {
			return 0x80
		}
		return 0
	}
	return best
}

func TestE4M3AllCodesRoundTrip(t *testing.T) {
	for c := 0; c < 256; c++ {
		f := E4M3ToFloat32(uint8(c))
		if c&0x7f == 0x7f {
			if !math.IsNaN(float64(f)) {
				t.Errorf("code %#02x: got %v, want NaN", c, f)
			}
			if got := Float32ToE4M3(f); got != E4M3NaN {
				t.Errorf("NaN from code %#02x encodes to %#02x, want 0x7f", c, got)
			}
			continue
		}
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			t.Errorf("code %#02x decodes to %v", c, f)
		}
		if got := Float32ToE4M3(f); got != uint8(c) {
			t.Errorf("code %#02x -> %v -> %#02x", c, f, got)
		}
	}
}

func TestE4M3Values(t *testing.T) {
	tests := []struct {
		code uint8
		want float32
	}{
		{0x00, 0}, {0x80, float32(math.Copysign(0, -1))},
		{0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64},
		{0x38, 1}, {0xb8, -1}, {0x3c, 1.5}, {0x40, 2},
		{0x7e, 448}, {0xfe, -448}, {0x7d, 416},
	}
	for _, tt := range tests {
		got := E4M3ToFloat32(tt.code)
		if got != tt.want || math.Signbit(float64(got)) != math.Signbit(float64(tt.want)) {
			t.Errorf("E4M3ToFloat32(%#02x) = %v, want %v", tt.code, got, tt.want)
		}
	}
}

func TestFloat32ToE4M3(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	tests := []struct {
		name string
		in   float32
		want uint8
	}{
		{"zero", 0, 0x00},
		{"neg zero", float32(math.Copysign(0, -1)), 0x80},
		{"one", 1, 0x38},
		{"tie 1+1/16 to even 1", 1 + 1.0/16, 0x38},
		{"tie 1+3/16 to even 1.25", 1 + 3.0/16, 0x3a},
		{"just above tie rounds up", math.Nextafter32(1+1.0/16, 2), 0x39},
		{"max", 448, 0x7e},
		{"above max saturates", 460, 0x7e},
		{"480 saturates", 480, 0x7e},
		{"huge saturates", 1e30, 0x7e},
		{"neg huge saturates", -1e30, 0xfe},
		{"+inf saturates", inf, 0x7e},
		{"-inf saturates", -inf, 0xfe},
		{"nan", nan, 0x7f},
		{"neg nan", float32(math.Copysign(math.NaN(), -1)), 0x7f},
		{"smallest subnormal", 1.0 / 512, 0x01},
		{"half smallest subnormal ties to zero", 1.0 / 1024, 0x00},
		{"above half smallest subnormal", math.Nextafter32(1.0/1024, 1), 0x01},
		{"subnormal tie 1.5/512 to even 2", 1.5 / 512, 0x02},
		{"subnormal tie 2.5/512 to even 2", 2.5 / 512, 0x02},
		{"largest subnormal rounds to min normal", 7.5 / 512, 0x08},
		{"tiny", 1e-30, 0x00},
		{"neg tiny", -1e-30, 0x80},
		{"416..448 tie to even 448", 432, 0x7e},
		{"rounding carries into exponent", 1.9375, 0x40},
	}
	for _, tt := range tests {
		if got := Float32ToE4M3(tt.in); got != tt.want {
			t.Errorf("%s: Float32ToE4M3(%v) = %#02x, want %#02x", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestFloat32ToE4M3MatchesReference(t *testing.T) {
	// Every midpoint between adjacent codes, its neighbours, and random values.
	var in []float32
	for c := 0; c < 0x7e; c++ {
		lo, hi := float64(E4M3ToFloat32(uint8(c))), float64(E4M3ToFloat32(uint8(c+1)))
		mid := float32((lo + hi) / 2)
		in = append(in, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000), -mid)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		in = append(in, math.Float32frombits(r.Uint32()), float32(r.NormFloat64()*100))
	}
	for _, f := range in {
		if got, want := Float32ToE4M3(f), e4m3Ref(f); got != want {
			t.Fatalf("Float32ToE4M3(%v [%#08x]) = %#02x, reference %#02x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestBulkE4M3(t *testing.T) {
	for _, n := range []int{256, 256 * 9} { // short (scalar) and long (table) paths
		src := make([]byte, n)
		for i := range src {
			src[i] = uint8(i * 7)
		}
		dst := make([]float32, n)
		DecodeE4M3(dst, src)
		back := make([]byte, n)
		EncodeE4M3(back, dst)
		for i := range src {
			if want := E4M3ToFloat32(src[i]); math.Float32bits(dst[i]) != math.Float32bits(want) {
				t.Fatalf("n=%d: dst[%d] = %v, want %v", n, i, dst[i], want)
			}
			want := src[i]
			if want&0x7f == 0x7f {
				want = E4M3NaN
			}
			if back[i] != want {
				t.Fatalf("n=%d: code %#02x: bulk round trip gave %#02x", n, src[i], back[i])
			}
		}
	}
}
