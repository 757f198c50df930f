package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

// codec is one of the element formats with a scalar code: its codes'
// float32 values and back, and (for the byte-aligned ones) the bulk
// converters over little-endian codes. The tests below hold every format to
// the same properties; what is particular to one (its reference encoder,
// its packing) is tested beside it.
type codec struct {
	name   string
	bits   int                       // bits of a code
	finite bool                      // no code decodes to ±Inf
	max    uint32                    // with finite, the largest value's code: what larger values saturate to
	decode func(code uint32) float32 // the scalar decoder
	encode func(f float32) uint32    // the scalar encoder
	// The bulk converters of size-byte codes (nil for E2M1, which packs two
	// codes a byte: TestE2M1PackOrder).
	decodeBulk func(dst []float32, src []byte)
	encodeBulk func(dst []byte, src []float32)
}

var (
	bf16Codec = codec{name: "BF16", bits: 16,
		decode: func(c uint32) float32 { return BF16ToFloat32(uint16(c)) }, encode: func(f float32) uint32 { return uint32(Float32ToBF16(f)) },
		decodeBulk: DecodeBF16, encodeBulk: EncodeBF16}
	f16Codec = codec{name: "F16", bits: 16,
		decode: func(c uint32) float32 { return F16ToFloat32(uint16(c)) }, encode: func(f float32) uint32 { return uint32(Float32ToF16(f)) },
		decodeBulk: DecodeF16, encodeBulk: EncodeF16}
	e4m3Codec = codec{name: "E4M3", bits: 8, finite: true, max: 0x7e,
		decode: func(c uint32) float32 { return E4M3ToFloat32(uint8(c)) }, encode: func(f float32) uint32 { return uint32(Float32ToE4M3(f)) },
		decodeBulk: DecodeE4M3, encodeBulk: EncodeE4M3}
	e2m1Codec = codec{name: "E2M1", bits: 4, finite: true, max: 0x7,
		decode: func(c uint32) float32 { return E2M1ToFloat32(uint8(c)) }, encode: func(f float32) uint32 { return uint32(Float32ToE2M1(f)) }}

	codecs = []codec{bf16Codec, f16Codec, e4m3Codec, e2m1Codec}
)

// size is the bytes of a bulk code.
func (c codec) size() int { return c.bits / 8 }

// code is the little-endian code at element i of src.
func (c codec) code(src []byte, i int) uint32 {
	if c.size() == 2 {
		return uint32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return uint32(src[i])
}

// put stores code as element i of dst.
func (c codec) put(dst []byte, i int, code uint32) {
	if c.size() == 2 {
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(code))
		return
	}
	dst[i] = uint8(code)
}

// TestCodecAllCodesRoundTrip decodes every code and encodes it back: the
// same code, or for a NaN a NaN (which one is the encoder's to choose:
// TestEncode pins it).
func TestCodecAllCodesRoundTrip(t *testing.T) {
	for _, c := range codecs {
		for code := range uint32(1) << c.bits {
			f := c.decode(code)
			back := c.encode(f)
			if math.IsNaN(float64(f)) {
				if !math.IsNaN(float64(c.decode(back))) {
					t.Errorf("%s: NaN code %#x re-encodes to non-NaN %#x", c.name, code, back)
				}
				continue
			}
			if c.finite && math.IsInf(float64(f), 0) {
				t.Errorf("%s: code %#x decodes to %v", c.name, code, f)
			}
			if back != code {
				t.Errorf("%s: code %#x -> %v -> %#x", c.name, code, f, back)
			}
		}
	}
}

// TestEncode pins each encoder's rounding (to nearest, ties to even),
// overflow (to ±Inf, or saturating where the format has none), signed zeros
// and NaNs.
func TestEncode(t *testing.T) {
	bits := math.Float32frombits
	negZero := float32(math.Copysign(0, -1))
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	type encodeCase struct {
		name string
		in   float32
		want uint32
	}
	for _, c := range []struct {
		codec codec
		cases []encodeCase
	}{
		{bf16Codec, []encodeCase{
			{"one", 1, 0x3f80},
			{"tie to even (down)", bits(0x3f808000), 0x3f80},
			{"tie to even (up)", bits(0x3f818000), 0x3f82},
			{"above tie", bits(0x3f808001), 0x3f81},
			{"below tie", bits(0x3f807fff), 0x3f80},
			{"max float32 overflows to inf", math.MaxFloat32, 0x7f80},
			{"inf", inf, 0x7f80},
			{"-inf", -inf, 0xff80},
			{"nan with low payload only stays nan", bits(0x7f800001), 0x7fc0},
			{"neg nan", bits(0xffc00000), 0xffc0},
			{"neg zero", negZero, 0x8000},
			{"subnormal tie", bits(0x00008000), 0x0000},
		}},
		{f16Codec, []encodeCase{
			{"one", 1, 0x3c00},
			{"tie to even down", 1 + 1.0/2048, 0x3c00},
			{"tie to even up", 1 + 3.0/2048, 0x3c02},
			{"max", 65504, 0x7bff},
			{"overflow to inf", 65520, 0x7c00},
			{"smallest subnormal", float32(math.Ldexp(1, -24)), 0x0001},
			{"half smallest subnormal ties to zero", float32(math.Ldexp(1, -25)), 0x0000},
			{"neg", -2, 0xc000},
			{"-inf", -inf, 0xfc00},
		}},
		{e4m3Codec, []encodeCase{
			{"zero", 0, 0x00},
			{"neg zero", negZero, 0x80},
			{"one", 1, 0x38},
			{"tie 1+1/16 to even 1", 1 + 1.0/16, 0x38},
			{"tie 1+3/16 to even 1.25", 1 + 3.0/16, 0x3a},
			{"just above tie rounds up", math.Nextafter32(1+1.0/16, 2), 0x39},
			{"max", 448, 0x7e},
			{"416 exact", 416, 0x7d},
			{"above max saturates", 460, 0x7e},
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
		}},
		{e2m1Codec, []encodeCase{
			{"zero", 0, 0x0},
			{"negative zero", negZero, 0x8},
			// Every tie and its neighbours: TestE2M1NearestEven; two of them here.
			{"tie 0.25 to 0", 0.25, 0x0},
			{"tie 0.75 to 1.0", 0.75, 0x2},
			{"negative tie -0.75", -0.75, 0xa},
			{"negative tie -5", -5, 0xe},
			{"small negative is -0", -0.1, 0x8},
			{"saturate -6.5", -6.5, 0xf},
			{"NaN is +max", nan, 0x7},
		}},
	} {
		for _, tt := range c.cases {
			if got := c.codec.encode(tt.in); got != tt.want {
				t.Errorf("%s: %s: Float32To%s(%v [%#08x]) = %#x, want %#x", c.codec.name, tt.name, c.codec.name, tt.in, math.Float32bits(tt.in), got, tt.want)
			}
		}
	}
}

// TestCodecSaturates holds the formats without infinities (E4M3, E2M1) to
// saturating: past the largest value max, at the tie with the value a next
// binade step would have, beyond it and at ±Inf, the encoders give ±max.
func TestCodecSaturates(t *testing.T) {
	for _, c := range codecs {
		if !c.finite {
			continue
		}
		top, prev := c.decode(c.max), c.decode(c.max-1)
		next := 2*top - prev // E4M3: 480, E2M1: 8
		neg := uint32(1) << (c.bits - 1)
		for _, f := range []float32{top, math.Nextafter32(top, next), (top + next) / 2, next, 1e30, float32(math.Inf(1))} {
			if got := c.encode(f); got != c.max {
				t.Errorf("%s: Float32To%s(%v) = %#x, want %#x", c.name, c.name, f, got, c.max)
			}
			if got := c.encode(-f); got != c.max|neg {
				t.Errorf("%s: Float32To%s(%v) = %#x, want %#x", c.name, c.name, -f, got, c.max|neg)
			}
		}
	}
}

// TestCodecBulk holds the bulk converters to the scalar ones, bit for bit,
// at lengths around their unrolled and table paths.
func TestCodecBulk(t *testing.T) {
	for _, c := range codecs {
		if c.decodeBulk == nil {
			continue
		}
		for _, n := range []int{0, 1, 3, 4, 5, 17, 256, 256 * 9, 1 << 16} {
			src := make([]byte, c.size()*n)
			for i := range n {
				c.put(src, i, uint32(i*7919)&(1<<c.bits-1))
			}
			dst := make([]float32, n)
			c.decodeBulk(dst, src)
			back := make([]byte, c.size()*n)
			c.encodeBulk(back, dst)
			for i := range n {
				code := c.code(src, i)
				if want := c.decode(code); math.Float32bits(dst[i]) != math.Float32bits(want) {
					t.Fatalf("%s n=%d: dst[%d] = %v, want %v", c.name, n, i, dst[i], want)
				}
				if got, want := c.code(back, i), c.encode(dst[i]); got != want {
					t.Fatalf("%s n=%d: code %#x: bulk round trip gave %#x, want %#x", c.name, n, code, got, want)
				}
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

// BenchmarkDecode and BenchmarkEncode run the bulk converters over 1M
// codes (b.SetBytes: the bytes of codes).
func BenchmarkDecode(b *testing.B) {
	for _, c := range codecs {
		if c.decodeBulk == nil {
			continue
		}
		const n = 1 << 20
		src := make([]byte, c.size()*n)
		for i := range src {
			src[i] = byte(i * 31)
		}
		dst := make([]float32, n)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				c.decodeBulk(dst, src)
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range codecs {
		if c.encodeBulk == nil {
			continue
		}
		const n = 1 << 20
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i) * 0.001
		}
		dst := make([]byte, c.size()*n)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(dst)))
			for b.Loop() {
				c.encodeBulk(dst, src)
			}
		})
	}
}
