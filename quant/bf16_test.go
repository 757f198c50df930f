package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestBF16AllCodesRoundTrip(t *testing.T) {
	for c := 0; c < 1<<16; c++ {
		f := BF16ToFloat32(uint16(c))
		got := Float32ToBF16(f)
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(BF16ToFloat32(got))) {
				t.Errorf("NaN code %#04x re-encodes to non-NaN %#04x", c, got)
			}
			continue
		}
		if got != uint16(c) {
			t.Errorf("code %#04x -> %v -> %#04x", c, f, got)
		}
	}
}

func TestFloat32ToBF16(t *testing.T) {
	tests := []struct {
		name string
		bits uint32
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"tie to even (down)", 0x3f808000, 0x3f80},
		{"tie to even (up)", 0x3f818000, 0x3f82},
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"max float32 overflows to inf", 0x7f7fffff, 0x7f80},
		{"inf", 0x7f800000, 0x7f80},
		{"-inf", 0xff800000, 0xff80},
		{"nan with low payload only stays nan", 0x7f800001, 0x7fc0},
		{"neg nan", 0xffc00000, 0xffc0},
		{"neg zero", 0x80000000, 0x8000},
		{"subnormal tie", 0x00008000, 0x0000},
	}
	for _, tt := range tests {
		if got := Float32ToBF16(math.Float32frombits(tt.bits)); got != tt.want {
			t.Errorf("%s: Float32ToBF16(%#08x) = %#04x, want %#04x", tt.name, tt.bits, got, tt.want)
		}
	}
}

func TestBulkBF16(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 17, 1 << 16} {
		src := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(src[2*i:], uint16(i*7919))
		}
		dst := make([]float32, n)
		DecodeBF16(dst, src)
		for i := range n {
			if want := BF16ToFloat32(uint16(i * 7919)); math.Float32bits(dst[i]) != math.Float32bits(want) {
				t.Fatalf("n=%d: dst[%d] = %v, want %v", n, i, dst[i], want)
			}
		}
		back := make([]byte, 2*n)
		EncodeBF16(back, dst)
		for i := range n {
			h := binary.LittleEndian.Uint16(src[2*i:])
			g := binary.LittleEndian.Uint16(back[2*i:])
			if h != g && !math.IsNaN(float64(BF16ToFloat32(h))) {
				t.Fatalf("n=%d: round trip of %#04x gave %#04x", n, h, g)
			}
		}
	}
}

func TestBulkShortBufferPanics(t *testing.T) {
	tests := []struct {
		name string
		f    func()
	}{
		{"DecodeBF16", func() { DecodeBF16(make([]float32, 2), make([]byte, 3)) }},
		{"DecodeF16", func() { DecodeF16(make([]float32, 2), make([]byte, 3)) }},
		{"DecodeE4M3", func() { DecodeE4M3(make([]float32, 2), make([]byte, 1)) }},
		{"EncodeBF16", func() { EncodeBF16(make([]byte, 3), make([]float32, 2)) }},
		{"EncodeF16", func() { EncodeF16(make([]byte, 3), make([]float32, 2)) }},
		{"EncodeE4M3", func() { EncodeE4M3(make([]byte, 1), make([]float32, 2)) }},
	}
	for _, tt := range tests {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with a short buffer did not panic", tt.name)
				}
			}()
			tt.f()
		}()
	}
}

func BenchmarkDecodeBF16(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, 2*n)
	for i := range src {
		src[i] = byte(i * 31)
	}
	dst := make([]float32, n)
	b.SetBytes(2 * n) // bytes of bf16 input per op
	for b.Loop() {
		DecodeBF16(dst, src)
	}
}

func BenchmarkEncodeBF16(b *testing.B) {
	const n = 1 << 20
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i) * 0.001
	}
	dst := make([]byte, 2*n)
	b.SetBytes(2 * n)
	for b.Loop() {
		EncodeBF16(dst, src)
	}
}

func BenchmarkDecodeE4M3(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 31)
	}
	dst := make([]float32, n)
	b.SetBytes(n)
	for b.Loop() {
		DecodeE4M3(dst, src)
	}
}
