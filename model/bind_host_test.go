package model

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// TestLinearSplit: the row blocks of a dense and of an NVFP4 linear compute
// the rows of the whole weight's matmul (bias included), and a packed
// weight without its block scales is a named error.
func TestLinearSplit(t *testing.T) {
	const rows, cols = 40, 64
	rng := rand.New(rand.NewPCG(1, 2))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	bias := make([]float32, rows)
	for i := range bias {
		bias[i] = float32(i) / 8
	}
	q, err := quant.QuantizeNVFP4(w, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	gs := make([]byte, 4)
	binary.LittleEndian.PutUint32(gs, math.Float32bits(q.GlobalScale))
	dir := t.TempDir()
	cw, err := weights.Create(filepath.Join(dir, "model.safetensors"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name  string
		dt    weights.DType
		shape []int
		data  []byte
	}{
		{"dense.weight", weights.F32, []int{rows, cols}, f32Bytes(w)},
		{"dense.bias", weights.F32, []int{rows}, f32Bytes(bias)},
		{"fp4.weight", weights.U8, []int{rows, cols / 2}, q.Packed},
		{"fp4.weight_scale", weights.F8E4M3, []int{rows, cols / 16}, q.Scales},
		{"fp4.weight_scale_2", weights.F32, []int{}, gs},
		{"fp4.bias", weights.F32, []int{rows}, f32Bytes(bias)},
		{"noscale.weight", weights.U8, []int{rows, cols / 2}, q.Packed},
	} {
		if err := cw.Add(x.name, x.dt, x.shape, x.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	ck := openCheckpoint(t, dir)
	b := cpu.New(1)
	l := NewLoader(b, ck)
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	xb := b.NewBuffer(cols)
	b.Write(xb, 0, x)
	for _, module := range []string{"dense", "fp4"} {
		whole, err := l.Linear(module, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, rows)
		out := b.NewBuffer(rows)
		b.MatMul(out, xb, whole, 1)
		b.Read(want, out, 0)
		parts := []int{7, 1, 32}
		ws, err := l.LinearSplit(module, cols, parts...)
		if err != nil {
			t.Fatal(err)
		}
		r0 := 0
		for i, n := range parts {
			if ws[i].Rows() != n || ws[i].Cols() != cols {
				t.Fatalf("%s part %d: [%d, %d], want [%d, %d]", module, i, ws[i].Rows(), ws[i].Cols(), n, cols)
			}
			got := make([]float32, n)
			o := b.NewBuffer(n)
			b.MatMul(o, xb, ws[i], 1)
			b.Read(got, o, 0)
			for r := range n {
				if d := math.Abs(float64(got[r] - want[r0+r])); d > 1e-4 {
					t.Errorf("%s row %d: %v, whole matmul %v", module, r0+r, got[r], want[r0+r])
				}
			}
			r0 += n
		}
	}
	for _, tc := range []struct {
		module string
		parts  []int
		want   error
		msg    string
	}{
		{"noscale", []int{rows}, nvfp4ckpt.ErrMissingScale, "noscale.weight_scale"},
		{"fp4", []int{rows, 1}, nil, "config implies [41, 64]"},
		{"dense", []int{rows - 1}, nil, "config implies [39 64]"},
		{"dense", []int{rows, 0}, nil, "row block of 0 rows"},
		{"absent", []int{rows}, weights.ErrMissingTensor, "absent.weight"},
	} {
		_, err := l.LinearSplit(tc.module, cols, tc.parts...)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("LinearSplit(%s, %v): err = %v, want %v naming %q", tc.module, tc.parts, err, tc.want, tc.msg)
		}
	}
}
