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
// NVFP4, FP8 (widened: the benchmarks' baseline, and the weights the FP8
// kernels do not take) with power-of-two scales in bfloat16, FP8 with
// float32 scales in float32. Needs no GPU.
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
		w, err := widen(tc.h, false)
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

// TestWidenKeepsFP8 checks which FP8 weights the device keeps as FP8 (128x128
// tiles, K % 16 == 0) and that their float32 scales are the tiles' scales.
// Needs no GPU.
func TestWidenKeepsFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		rows, cols, block int
		sd                quant.ScaleDType
		kept              bool
	}{
		{200, 272, 128, quant.ScaleE8M0, true},
		{130, 4096, 128, quant.ScaleF32, true},
		{7, 64, 128, quant.ScaleE8M0, true},
		{33, 200, 128, quant.ScaleE8M0, false}, // K % 16 != 0
		{64, 96, 32, quant.ScaleE8M0, false},   // 32x32 tiles (DeepSeek-V4.1's dense weights)
	} {
		v := make([]float32, tc.rows*tc.cols)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		q, err := quant.QuantizeFP8Block(v, tc.rows, tc.cols, tc.block, tc.block, tc.sd)
		if err != nil {
			t.Fatal(err)
		}
		h := &backend.HostWeight{Name: "w", Rows: tc.rows, Cols: tc.cols, Format: backend.FP8Block, FP8: q}
		w, err := widen(h, true)
		if err != nil {
			t.Fatal(err)
		}
		if kept := w.Format == backend.FP8Block; kept != tc.kept {
			t.Errorf("%dx%d blocks %d: kept as FP8 = %v, want %v", tc.rows, tc.cols, tc.block, kept, tc.kept)
		}
		if !tc.kept {
			continue
		}
		sc := fp8Scales(q)
		sr, scc := q.ScaleShape()
		if len(sc) != 4*sr*scc {
			t.Fatalf("%d scale bytes, want %d", len(sc), 4*sr*scc)
		}
		for i := range sr * scc {
			got := math.Float32frombits(binary.LittleEndian.Uint32(sc[4*i:]))
			if want := q.Scale(i/scc*128, i%scc*128); got != want {
				t.Errorf("%dx%d: scale %d is %v, want %v", tc.rows, tc.cols, i, got, want)
			}
		}
	}
}
