package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// TestF16MatchesX448 decodes every code as x448/float16 does, NaNs keeping
// their sign (TestCodecAllCodesRoundTrip encodes them back).
func TestF16MatchesX448(t *testing.T) {
	for c := 0; c < 1<<16; c++ {
		f := F16ToFloat32(uint16(c))
		ref := float16.Frombits(uint16(c)).Float32()
		if math.IsNaN(float64(ref)) {
			if !math.IsNaN(float64(f)) || math.Signbit(float64(f)) != math.Signbit(float64(ref)) {
				t.Errorf("code %#04x: got %v, want signed NaN", c, f)
			}
			continue
		}
		if math.Float32bits(f) != math.Float32bits(ref) {
			t.Errorf("code %#04x: got %v, want %v", c, f, ref)
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
