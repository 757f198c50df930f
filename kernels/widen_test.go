package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// TestWiden holds the formats the GPU stores released checkpoints' weights
// in to the values the CPU computes with, bit for bit: MXFP4 re-blocked as
// NVFP4, FP8 with power-of-two scales in bfloat16, FP8 with float32 scales
// in float32. Needs no GPU.
func TestWiden(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rows, cols := 70, 320
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(rng.NormFloat64()) * 0.02
	}
	mx, err := quant.QuantizeMXFP4(v, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	e8, err := quant.QuantizeFP8Block(v, rows, cols, 128, 128, quant.ScaleE8M0)
	if err != nil {
		t.Fatal(err)
	}
	f32, err := quant.QuantizeFP8Block(v, rows, cols, 128, 128, quant.ScaleF32)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		h    *backend.HostWeight
		want backend.Format
		ref  []float32
	}{
		{"mxfp4", &backend.HostWeight{Name: "mx", Rows: rows, Cols: cols, Format: backend.MXFP4, MX: mx}, backend.NVFP4, mx.Dequantize()},
		{"fp8/e8m0", &backend.HostWeight{Name: "e8", Rows: rows, Cols: cols, Format: backend.FP8Block, FP8: e8}, backend.BF16, e8.Dequantize()},
		{"fp8/f32", &backend.HostWeight{Name: "f32", Rows: rows, Cols: cols, Format: backend.FP8Block, FP8: f32}, backend.F32, f32.Dequantize()},
	} {
		w, err := widen(tc.h)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if w.Format != tc.want {
			t.Errorf("%s: widened to %s, want %s", tc.name, w.Format, tc.want)
			continue
		}
		got := make([]float32, rows*cols)
		switch w.Format {
		case backend.NVFP4:
			got = w.Q.Dequantize()
		case backend.BF16:
			quant.DecodeBF16(got, w.Data)
		case backend.F32:
			for i := range got {
				got[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*i:]))
			}
		}
		if !slices.Equal(got, tc.ref) {
			t.Errorf("%s: widened values differ from the CPU's dequantization", tc.name)
		}
	}
}
