package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

func randn(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// f32Bytes is v as little-endian float32 bytes (an F32 weight's data).
func f32Bytes(v []float32) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, v)
	if err != nil {
		panic(err)
	}
	return b
}

func bf16Bytes(v []float32) ([]byte, []float32) {
	b := make([]byte, 2*len(v))
	r := make([]float32, len(v))
	for i, x := range v {
		h := quant.Float32ToBF16(x)
		binary.LittleEndian.PutUint16(b[2*i:], h)
		r[i] = quant.BF16ToFloat32(h)
	}
	return b, r
}

// refMatMul is the definition: out[i, r] = Σ_k x[i, k]·w[r, k] + bias[r], in float64.
func refMatMul(x, w, bias []float32, m, K, N int) []float32 {
	out := make([]float32, m*N)
	for i := 0; i < m; i++ {
		for r := 0; r < N; r++ {
			var s float64
			for k := 0; k < K; k++ {
				s += float64(x[i*K+k]) * float64(w[r*K+k])
			}
			if bias != nil {
				s += float64(bias[r])
			}
			out[i*N+r] = float32(s)
		}
	}
	return out
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// Shapes include sizes that are not multiples of the 4-row and 2-column
// unrolls, nor of the prefill GEMM's 6x16 tile (m >= 6). NVFP4 takes the
// float32 reference kernels here (TestQ8MatMul holds the int8 ones).
func TestMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := NewWithOptions(Options{Threads: 3, ReferenceNVFP4: true})
	for _, sh := range []struct{ m, K, N int }{{1, 16, 4}, {1, 33, 7}, {3, 64, 130}, {7, 129, 65}, {1, 1024, 513}, {13, 40, 37}, {6, 256, 16}} {
		for _, format := range []backend.Format{backend.F32, backend.BF16, backend.F16, backend.NVFP4} {
			if format == backend.NVFP4 && sh.K%16 != 0 {
				continue
			}
			w := randn(rng, sh.N*sh.K)
			x := randn(rng, sh.m*sh.K)
			bias := randn(rng, sh.N)
			h := &backend.HostWeight{Name: "w", Rows: sh.N, Cols: sh.K, Format: format, Bias: bias}
			switch format {
			case backend.F32:
				h.Data = f32Bytes(w)
			case backend.BF16:
				h.Data, w = bf16Bytes(w)
			case backend.F16:
				h.Data = make([]byte, 2*len(w))
				for i, v := range w {
					c := quant.Float32ToF16(v)
					binary.LittleEndian.PutUint16(h.Data[2*i:], c)
					w[i] = quant.F16ToFloat32(c)
				}
			case backend.NVFP4:
				q, err := quant.QuantizeNVFP4(w, sh.N, sh.K)
				if err != nil {
					t.Fatal(err)
				}
				h.Q, w = q, q.Dequantize()
			}
			wt, err := b.Upload(h)
			if err != nil {
				t.Fatal(err)
			}
			out := b.NewBuffer(sh.m * sh.N)
			b.MatMul(out, Buffer(x), wt, sh.m)
			want := refMatMul(x, w, bias, sh.m, sh.K, sh.N)
			// float32 accumulation over K terms of unit size: error ~ K·2⁻²⁴·√K.
			tol := 1e-5 * float64(sh.K)
			if d := maxDiff(Data(out), want); d > tol {
				t.Errorf("%v %+v: max diff %.3g > %.3g", format, sh, d, tol)
			}
		}
	}
}

func TestEmbed(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	b := New(1)
	w := randn(rng, 10*32)
	data, wr := bf16Bytes(w)
	q, _ := quant.QuantizeNVFP4(w, 10, 32)
	for _, h := range []*backend.HostWeight{
		{Name: "f32", Rows: 10, Cols: 32, Format: backend.F32, Data: f32Bytes(w)},
		{Name: "bf16", Rows: 10, Cols: 32, Format: backend.BF16, Data: data},
		{Name: "nvfp4", Rows: 10, Cols: 32, Format: backend.NVFP4, Q: q},
	} {
		ref := w
		switch h.Format {
		case backend.BF16:
			ref = wr
		case backend.NVFP4:
			ref = q.Dequantize()
		}
		wt, _ := b.Upload(h)
		out := b.NewBuffer(2 * 32)
		b.Embed(out, wt, []int32{7, 2})
		if d := maxDiff(Data(out), append(append([]float32{}, ref[7*32:8*32]...), ref[2*32:3*32]...)); d != 0 {
			t.Errorf("%s: embed differs by %g", h.Name, d)
		}
	}
}

func TestAttentionMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	b := New(2)
	for _, s := range []layers.AttentionShape{
		{Heads: 4, KVHeads: 2, HeadDim: 8},
		{Heads: 6, KVHeads: 1, HeadDim: 5, Window: 3},
		{Heads: 2, KVHeads: 2, HeadDim: 16, Window: 100},
	} {
		s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
		T := 11
		q := randn(rng, T*s.Heads*s.HeadDim)
		k := randn(rng, T*s.KVHeads*s.HeadDim)
		v := randn(rng, T*s.KVHeads*s.HeadDim)
		want := make([]float32, len(q))
		layers.Attention(want, q, k, v, T, 0, s)
		cache, _ := b.NewKVCache(backend.KVShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: T})
		got := make([]float32, len(q))
		// Prefill 6 tokens, then decode the rest one at a time.
		qr, kr := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
		for _, span := range [][2]int{{0, 6}, {6, 7}, {7, 8}, {8, 9}, {9, 10}, {10, 11}} {
			lo, hi := span[0], span[1]
			out := b.NewBuffer((hi - lo) * qr)
			b.Attention(out, Buffer(q[lo*qr:hi*qr]), Buffer(k[lo*kr:hi*kr]), Buffer(v[lo*kr:hi*kr]), cache, 0, lo, hi-lo, s)
			copy(got[lo*qr:], Data(out))
		}
		if d := maxDiff(got, want); d > 1e-5 {
			t.Errorf("%+v: max diff %.3g", s, d)
		}
		if cache.Len() != T {
			t.Errorf("cache len %d", cache.Len())
		}
	}
}

func TestElementwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	b := New(2)
	n := 40000
	g, u, w := randn(rng, n), randn(rng, n), randn(rng, 100)
	for i := range g {
		g[i] *= 20 // reach the clamp
	}
	got := make(Buffer, n)
	b.SwiGLU(got, Buffer(g), Buffer(u), 10)
	want := make([]float32, n)
	layers.SwiGLU(want, g, u, 10)
	if maxDiff(got, want) != 0 {
		t.Error("SwiGLU differs from layers.SwiGLU")
	}
	b.RMSNorm(got, Buffer(g), Buffer(w), 1e-6)
	layers.RMSNorm(want, g, w, 1e-6)
	if maxDiff(got, want) != 0 {
		t.Error("RMSNorm differs from layers.RMSNorm")
	}
}

// The portable dot products (used where AVX2 is missing) agree with the
// dispatching ones on every tail length.
func TestDotFallback(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for n := 1; n <= 70; n++ {
		x, w := randn(rng, n), randn(rng, n)
		bfb, _ := bf16Bytes(w)
		bf := make([]uint16, n)
		for i := range bf {
			bf[i] = uint16(bfb[2*i]) | uint16(bfb[2*i+1])<<8
		}
		tol := 1e-5 * float64(n)
		if d := math.Abs(float64(dotF32(x, w) - dotF32Go(x, w))); d > tol {
			t.Errorf("f32 n=%d: %g", n, d)
		}
		if d := math.Abs(float64(dotBF16(x, bf) - dotBF16Go(x, bf))); d > tol {
			t.Errorf("bf16 n=%d: %g", n, d)
		}
	}
}

// TestHugeBytes: hugeBytes gives n zeroed bytes, 2 MiB aligned from 2 MiB up
// on Linux.
func TestHugeBytes(t *testing.T) {
	for _, n := range []int{0, 100, 2 << 20, 5<<20 + 3} {
		b := hugeBytes(n)
		if len(b) != n || cap(b) != n {
			t.Fatalf("hugeBytes(%d): len %d cap %d", n, len(b), cap(b))
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("hugeBytes(%d)[%d] = %d", n, i, v)
			}
		}
		if runtime.GOOS == "linux" && n >= 2<<20 && uintptr(unsafe.Pointer(&b[0]))%(2<<20) != 0 {
			t.Errorf("hugeBytes(%d) at %p: not 2 MiB aligned", n, &b[0])
		}
	}
}

// TestCopyBF16: bf16 weights from 2 MiB up are copied into huge pages
// unless Options.MappedBF16, within half the machine's memory.
func TestCopyBF16(t *testing.T) {
	for _, c := range []struct {
		mapped bool
		n      int
		want   bool
	}{{false, 2 << 20, hugePages}, {false, 1 << 20, false}, {true, 8 << 20, false}} {
		b := NewWithOptions(Options{MappedBF16: c.mapped})
		if b.MemoryBytes() == 0 {
			t.Skip("memory size unknown")
		}
		if got := b.copyBF16(c.n); got != c.want {
			t.Errorf("mapped %v, %d bytes: copy %v, want %v", c.mapped, c.n, got, c.want)
		}
	}
	b := NewWithOptions(Options{})
	if b.MemoryBytes() > 0 && b.copyBF16(int(b.MemoryBytes()/2)+1) {
		t.Errorf("copied more than half the memory")
	}
}

// TestAddScaleParallel: Add and Scale split over threads (past
// elementwiseGrain, a length off it) equal the serial loops, in place too.
func TestAddScaleParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 22))
	const n = 3*elementwiseGrain + 17
	x, y := randn(rng, n), randn(rng, n)
	b := New(4)
	sum, prod := make(Buffer, n), make(Buffer, n)
	b.Add(sum, Buffer(x), Buffer(y))
	b.Scale(prod, Buffer(x), 0.37)
	inPlace := append(Buffer(nil), x...)
	b.Add(inPlace, inPlace, Buffer(y))
	for i := range n {
		if sum[i] != x[i]+y[i] || prod[i] != x[i]*0.37 || inPlace[i] != sum[i] {
			t.Fatalf("element %d: %v %v %v, want %v %v", i, sum[i], prod[i], inPlace[i], x[i]+y[i], x[i]*0.37)
		}
	}
}
