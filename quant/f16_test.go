package quant

import (
	"encoding/binary"
	"math"
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

// f16Input is 1M half values covering every code, normals dominating as in
// real weights.
func f16Input() []uint16 {
	src := make([]uint16, 1<<20)
	for i := range src {
		src[i] = uint16(i * 7919)
	}
	return src
}

var sinkF32 float32

// BenchmarkF16Decode compares three scalar decoders over the same input:
// the bit-trick decoder used here, x448/float16, and a 65536-entry table.
func BenchmarkF16Decode(b *testing.B) {
	src := f16Input()
	b.Run("bits", func(b *testing.B) {
		b.SetBytes(int64(2 * len(src)))
		var s float32
		for b.Loop() {
			for _, h := range src {
				s += F16ToFloat32(h)
			}
		}
		sinkF32 = s
	})
	b.Run("x448", func(b *testing.B) {
		b.SetBytes(int64(2 * len(src)))
		var s float32
		for b.Loop() {
			for _, h := range src {
				s += float16.Frombits(h).Float32()
			}
		}
		sinkF32 = s
	})
	b.Run("table", func(b *testing.B) {
		table := make([]float32, 1<<16)
		for i := range table {
			table[i] = F16ToFloat32(uint16(i))
		}
		b.SetBytes(int64(2 * len(src)))
		var s float32
		for b.Loop() {
			for _, h := range src {
				s += table[h]
			}
		}
		sinkF32 = s
	})
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
