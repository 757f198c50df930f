package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

func TestF16AllCodes(t *testing.T) {
	for c := 0; c < 1<<16; c++ {
		h := uint16(c)
		f := F16ToFloat32(h)
		ref := float16.Frombits(h).Float32()
		if math.IsNaN(float64(ref)) {
			if !math.IsNaN(float64(f)) || math.Signbit(float64(f)) != math.Signbit(float64(ref)) {
				t.Errorf("code %#04x: got %v, want signed NaN", c, f)
			}
			if back := Float32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Errorf("NaN code %#04x re-encodes to non-NaN %#04x", c, back)
			}
			continue
		}
		if math.Float32bits(f) != math.Float32bits(ref) {
			t.Errorf("code %#04x: got %v, want %v", c, f, ref)
		}
		if back := Float32ToF16(f); back != h {
			t.Errorf("code %#04x -> %v -> %#04x", c, f, back)
		}
	}
}

func TestFloat32ToF16(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"tie to even down", 1 + 1.0/2048, 0x3c00},
		{"tie to even up", 1 + 3.0/2048, 0x3c02},
		{"max", 65504, 0x7bff},
		{"overflow to inf", 65520, 0x7c00},
		{"smallest subnormal", float32(math.Ldexp(1, -24)), 0x0001},
		{"half smallest subnormal ties to zero", float32(math.Ldexp(1, -25)), 0x0000},
		{"neg", -2, 0xc000},
		{"-inf", float32(math.Inf(-1)), 0xfc00},
	}
	for _, tt := range tests {
		if got := Float32ToF16(tt.in); got != tt.want {
			t.Errorf("%s: Float32ToF16(%v) = %#04x, want %#04x", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestBulkF16(t *testing.T) {
	n := 1 << 16
	src := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	dst := make([]float32, n)
	DecodeF16(dst, src)
	back := make([]byte, 2*n)
	EncodeF16(back, dst)
	for i := range n {
		if math.Float32bits(dst[i]) != math.Float32bits(F16ToFloat32(uint16(i))) {
			t.Fatalf("dst[%d] = %v", i, dst[i])
		}
		if g := binary.LittleEndian.Uint16(back[2*i:]); g != uint16(i) && !math.IsNaN(float64(dst[i])) {
			t.Fatalf("round trip of %#04x gave %#04x", i, g)
		}
	}
}

// f16Inputs returns two 1M-value inputs: every code in turn (about 3% of
// them subnormal, Inf or NaN) and the halves of Gaussian weights (std 0.02),
// which is what checkpoints hold.
func f16Inputs() map[string][]byte {
	all := make([]byte, 2<<20)
	w := make([]byte, 2<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 1 << 20 {
		binary.LittleEndian.PutUint16(all[2*i:], uint16(i*7919))
		binary.LittleEndian.PutUint16(w[2*i:], Float32ToF16(float32(r.NormFloat64()*0.02)))
	}
	return map[string][]byte{"allcodes": all, "weights": w}
}

// BenchmarkF16Decode compares bulk decoders over the same input: the
// bit-trick decoder DecodeF16 uses, x448/float16, and a 65536-entry table.
func BenchmarkF16Decode(b *testing.B) {
	table := make([]float32, 1<<16)
	for i := range table {
		table[i] = F16ToFloat32(uint16(i))
	}
	decoders := []struct {
		name string
		f    func(dst []float32, src []byte)
	}{
		{"bits", DecodeF16},
		{"x448", func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = float16.Frombits(binary.LittleEndian.Uint16(src[2*i:])).Float32()
			}
		}},
		{"table", func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = table[binary.LittleEndian.Uint16(src[2*i:])]
			}
		}},
	}
	for _, in := range []string{"weights", "allcodes"} {
		src := f16Inputs()[in]
		dst := make([]float32, len(src)/2)
		for _, d := range decoders {
			b.Run(in+"/"+d.name, func(b *testing.B) {
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					d.f(dst, src)
				}
			})
		}
	}
}

func BenchmarkDecodeF16(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, 2*n)
	for i := range src {
		src[i] = byte(i * 31)
	}
	dst := make([]float32, n)
	b.SetBytes(2 * n)
	for b.Loop() {
		DecodeF16(dst, src)
	}
}
