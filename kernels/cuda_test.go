package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testimage"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/quant"
)

// MANIFOLD_KERNEL_IMAGE: an image built after this test binary (kernels/gpu.sh run).
func init() { testimage.FromEnv() }

func newGPU(t testing.TB) *Backend {
	t.Helper()
	if !Available() {
		t.Skip("no CUDA driver or GPU")
	}
	b, err := New(0, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func randn(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func toGPU(b *Backend, v []float32) backend.Buffer {
	x := b.NewBuffer(len(v))
	b.Write(x, 0, v)
	return x
}

func fromGPU(t testing.TB, b *Backend, x backend.Buffer) []float32 {
	out := make([]float32, x.Len())
	b.Read(out, x, 0)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}

// relErr is ‖a − b‖ / ‖b‖.
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / max(den, 1e-30))
}

func hostWeight(rng *rand.Rand, f backend.Format, n, k int) *backend.HostWeight {
	w := randn(rng, n*k)
	h := &backend.HostWeight{Name: "w", Rows: n, Cols: k, Format: f, Bias: randn(rng, n)}
	switch f {
	case backend.F32:
		h.Data = make([]byte, 4*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint32(h.Data[4*i:], math.Float32bits(v))
		}
	case backend.BF16, backend.F16:
		h.Data = make([]byte, 2*len(w))
		for i, v := range w {
			c := quant.Float32ToBF16(v)
			if f == backend.F16 {
				c = quant.Float32ToF16(v)
			}
			binary.LittleEndian.PutUint16(h.Data[2*i:], c)
		}
	case backend.NVFP4:
		h.Q, _ = quant.QuantizeNVFP4(w, n, k)
	}
	return h
}

// Tolerance: both sides accumulate in float32 in different orders; over K
// unit-variance terms the relative error stays near 1e-6·√K, far under 1e-4.
// The NVFP4 tensor-core kernel rounds activations to fp16 (relative 2^-11
// each, averaging down over K), so it gets 1e-3.
const matmulTol = 1e-4

func TestMatMul(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct{ m, n, k int }{{1, 7, 16}, {1, 300, 64}, {3, 129, 96}, {5, 64, 40}, {1, 513, 1024}, {16, 256, 4096}, {64, 130, 512},
		{1, 13, 128}, {17, 77, 384}, {70, 40, 256}, {130, 24, 128}, {5, 100, 512}, {1, 24, 256}, {9, 40, 768}, {8, 1000, 256},
		// gemv_nvfp4_tma (K % 2048 == 0): one tile, a partial tile, more tiles than multiprocessors.
		{1, 7, 2048}, {1, 300, 4096}, {1, 4133, 2048}, {1, 17, 14336},
		// ... and a partial last stage (K % 2048 of 256 to 1536; K under 2048:
		// that stage only), with partial tiles.
		{1, 45, 512}, {1, 300, 1536}, {1, 1000, 2560}, {1, 77, 3072}, {1, 129, 5120}, {1, 33, 9728}, {1, 20, 2304},
		// gemm_nvfp4_t*: K split over blocks (a partial feature tile, m not a
		// multiple of 8), several token tiles, each token tile size, stages of
		// 256 elements (K % 256 == 0) and of 128.
		{33, 300, 2048}, {2, 700, 1024}, {200, 260, 640}, {40, 129, 5120}, {12, 1030, 256}, {24, 64, 1280}, {7, 33, 384}, {13, 300, 640},
		// gemm_nvfp4_k512_t* (enough feature tiles to fill an H100's
		// multiprocessors): each token tile, a partial last tile, 1 to 3 stages.
		{3, 13600, 1536}, {9, 14000, 1024}, {20, 13600, 512}, {40, 13700, 512},
		// gemm_nvfp4_k256_t64_f2 (m > 64): two token tiles, a partial one.
		{100, 300, 768}} {
		for _, f := range []backend.Format{backend.F32, backend.BF16, backend.F16, backend.NVFP4} {
			if f == backend.NVFP4 && sh.k%16 != 0 {
				continue
			}
			h := hostWeight(rng, f, sh.n, sh.k)
			x := randn(rng, sh.m*sh.k)
			wc, wg := uploadBoth(t, g, c, h)
			want := make([]float32, sh.m*sh.n)
			c.MatMul(cpu.Buffer(want), cpu.Buffer(x), wc, sh.m)
			out := g.NewBuffer(sh.m * sh.n)
			g.MatMul(out, toGPU(g, x), wg, sh.m)
			tol := matmulTol
			if f == backend.NVFP4 {
				tol = 1e-3
			}
			if e := relErr(fromGPU(t, g, out), want); e > tol {
				t.Errorf("%v %+v: relative error %.3g", f, sh, e)
			}
		}
	}
}

func TestElementwiseAndNorms(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(3, 4))
	n := 1000
	a, bb, w := randn(rng, 3*n), randn(rng, 3*n), randn(rng, n)
	for i := range a {
		a[i] *= 15
	}
	check := func(name string, got, want []float32, tol float64) {
		if e := relErr(got, want); e > tol {
			t.Errorf("%s: relative error %.3g", name, e)
		}
	}
	want := make(cpu.Buffer, 3*n)
	out := g.NewBuffer(3 * n)
	c.SwiGLU(want, cpu.Buffer(a), cpu.Buffer(bb), 10)
	g.SwiGLU(out, toGPU(g, a), toGPU(g, bb), 10)
	check("swiglu", fromGPU(t, g, out), want, 1e-6)
	c.Add(want, cpu.Buffer(a), cpu.Buffer(bb))
	g.Add(out, toGPU(g, a), toGPU(g, bb))
	check("add", fromGPU(t, g, out), want, 0)
	c.Scale(want, cpu.Buffer(a), 0.3)
	g.Scale(out, toGPU(g, a), 0.3)
	check("scale", fromGPU(t, g, out), want, 0)
	c.RMSNorm(want, cpu.Buffer(a), cpu.Buffer(w), 1e-6)
	g.RMSNorm(out, toGPU(g, a), toGPU(g, w), 1e-6)
	check("rmsnorm", fromGPU(t, g, out), want, 1e-6)
	// Views: the second row only.
	gv := g.View(out, n, n)
	g.Copy(gv, toGPU(g, bb[:n]))
	check("view+copy", fromGPU(t, g, out)[n:2*n], bb[:n], 0)
}

func TestRoPE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		p                              layers.RoPEParams
		head, rows, heads, stride, off int
		interleaved, inverse           bool
	}{
		{layers.RoPEParams{Theta: 10000}, 64, 5, 3, 64, 0, false, false},
		{layers.RoPEParams{Type: "yarn", Theta: 160000, Factor: 16, OriginalMaxPositions: 256}, 64, 4, 2, 80, 16, true, true},
	} {
		r, err := layers.NewRoPE(tc.p, tc.head)
		if err != nil {
			t.Fatal(err)
		}
		r.Interleaved = tc.interleaved
		x := randn(rng, tc.rows*tc.heads*tc.stride)
		want := append(cpu.Buffer{}, x...)
		c.RoPE(want, tc.rows, tc.heads, tc.stride, tc.off, 1000, r, tc.inverse)
		gx := toGPU(g, x)
		g.RoPE(gx, tc.rows, tc.heads, tc.stride, tc.off, 1000, r, tc.inverse)
		if e := relErr(fromGPU(t, g, gx), want); e > 1e-5 {
			t.Errorf("%+v: relative error %.3g", tc.p, e)
		}
	}
}

func TestEmbedAndAttention(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, f := range []backend.Format{backend.F32, backend.BF16, backend.NVFP4} {
		h := hostWeight(rng, f, 50, 64)
		h.Bias = nil
		wc, _ := c.Upload(h)
		wg, _ := g.Upload(h)
		ids := []int32{3, 49, 0, 3}
		want := make(cpu.Buffer, 4*64)
		c.Embed(want, wc, ids)
		out := g.NewBuffer(4 * 64)
		g.Embed(out, wg, ids)
		if e := relErr(fromGPU(t, g, out), want); e > 1e-7 {
			t.Errorf("embed %v: %.3g", f, e)
		}
	}
	for _, s := range []layers.AttentionShape{{Heads: 8, KVHeads: 2, HeadDim: 64}, {Heads: 4, KVHeads: 4, HeadDim: 40, Window: 7}, {Heads: 3, KVHeads: 1, HeadDim: 128}} {
		compareAttention(t, g, c, rng, s, 2, 1, [][2]int{{0, 30}, {30, 31}, {31, 37}})
	}
}

// TestAttentionPrefill holds attn_prefill (prompt chunks of at least
// attnPrefillRows rows) to the CPU: chunks that are and are not multiples of
// its 64-row tiles, after earlier chunks (keys from the cache and from the
// chunk), a sliding window shorter and longer than a tile, then decode rows.
func TestAttentionPrefill(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(17, 18))
	for _, s := range []layers.AttentionShape{{Heads: 8, KVHeads: 2, HeadDim: 64}, {Heads: 4, KVHeads: 4, HeadDim: 128, Window: 50},
		{Heads: 6, KVHeads: 1, HeadDim: 128}, {Heads: 4, KVHeads: 2, HeadDim: 64, Window: 100}} {
		compareAttention(t, g, c, rng, s, 2, 1, [][2]int{{0, 100}, {100, 164}, {164, 165}, {165, 298}, {298, 299}})
	}
}

// compareAttention runs attention over random q, k, v on the GPU and the CPU
// in the given spans of positions (a prefill, then decode steps) through a
// cache of the given layers, attending in layer, and requires the outputs to
// agree within 1e-5 relative (float32 both sides, __expf on the GPU).
func compareAttention(t *testing.T, g *Backend, c *cpu.Backend, rng *rand.Rand, s layers.AttentionShape, nLayers, layer int, spans [][2]int) {
	t.Helper()
	s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
	T := spans[len(spans)-1][1]
	qr, kr := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	q, k, v := randn(rng, T*qr), randn(rng, T*kr), randn(rng, T*kr)
	shape := backend.KVShape{Layers: nLayers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: T}
	cc, _ := c.NewKVCache(shape)
	gc, err := g.NewKVCache(shape)
	if err != nil {
		t.Fatal(err)
	}
	for _, span := range spans {
		lo, hi := span[0], span[1]
		want := make(cpu.Buffer, (hi-lo)*qr)
		c.Attention(want, cpu.Buffer(q[lo*qr:hi*qr]), cpu.Buffer(k[lo*kr:hi*kr]), cpu.Buffer(v[lo*kr:hi*kr]), cc, layer, lo, hi-lo, s)
		out := g.NewBuffer((hi - lo) * qr)
		g.Attention(out, toGPU(g, q[lo*qr:hi*qr]), toGPU(g, k[lo*kr:hi*kr]), toGPU(g, v[lo*kr:hi*kr]), gc, layer, lo, hi-lo, s)
		if e := relErr(fromGPU(t, g, out), want); e > 1e-5 {
			t.Errorf("attention %+v rows [%d,%d): relative error %.3g", s, lo, hi, e)
		}
	}
}

// TestGoldenOnGPU runs the fixture models (f32 and bf16) on the GPU and the
// CPU: logits within 2e-2 (float32 on both sides, different summation orders,
// __expf in the softmax), greedy tokens equal. TestNVFP4GoldenOnGPU does the
// same for their NVFP4 conversions.
func TestGoldenOnGPU(t *testing.T) {
	g := newGPU(t)
	root := golden.Dir(t)
	for _, arch := range golden.Models(t) {
		for _, variant := range []string{"", "bf16"} {
			dir := filepath.Join(root, arch, variant)
			if _, err := model.LoadConfig(dir); err != nil {
				if errors.Is(err, model.ErrConfig) {
					t.Logf("%s: %v", dir, err)
				}
				continue
			}
			t.Run(filepath.Join(arch, variant+"."), func(t *testing.T) {
				ref := golden.Load(t, filepath.Join(root, arch))
				d, same := compareModels(t, g, dir, ref.InputIDs, model.Options{})
				requireClose(t, d, same)
			})
		}
	}
}

// TestSampleToken holds the device sampler to backend/cpu.SampleToken: the
// same id for the same logits and u, ties included (to the lower id).
func TestSampleToken(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{5, 1000, 32000, 128256} {
		l := randn(rng, n)
		for i := 0; i < n; i += 7 { // plenty of exact ties
			l[i] = l[i/2]
		}
		l[n/3] = 9 // a clear winner, tied once more below
		l[n-1] = 9
		gl := toGPU(g, l)
		for _, tc := range []struct {
			temp float32
			k    int
		}{{0, 0}, {0.7, 1}, {1, 40}, {1.3, 256}} {
			for trial := range 5 {
				u := rng.Float64()
				want, err := cpu.SampleToken(l, tc.temp, tc.k, u)
				if err != nil {
					t.Fatal(err)
				}
				got, err := g.SampleToken(gl, tc.temp, tc.k, u)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("n=%d temp=%g k=%d u=%g (trial %d): GPU picked %d, CPU %d", n, tc.temp, tc.k, u, trial, got, want)
				}
			}
		}
	}
	if _, err := g.SampleToken(toGPU(g, []float32{1, 2}), 1, 0, 0.5); err == nil {
		t.Error("top-k 0 with a temperature accepted")
	}
}

// TestSampleTokenNaN: a NaN logit is an error naming the first one, on the
// device as on the CPU, greedy or drawn, picked and waited for or held on the
// device (whose held value, gathered by EmbedToken, must not fault); the
// sampler works as before afterwards.
func TestSampleTokenNaN(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(13, 14))
	nan := float32(math.NaN())
	width := 64
	h := hostWeight(rng, backend.BF16, 1000, width)
	h.Bias = nil
	table, err := g.Upload(h)
	if err != nil {
		t.Fatal(err)
	}
	held, row := g.NewBuffer(1), g.NewBuffer(width)
	for _, n := range []int{5, 1000, 128256} {
		for _, at := range [][]int{{0}, {n / 2}, {n - 1}, {n - 1, n / 3}} {
			l := randn(rng, n)
			for _, i := range at {
				l[i] = nan
			}
			first := slices.Min(at)
			want := fmt.Sprintf("logit %d is NaN", first)
			gl := toGPU(g, l)
			for _, tc := range []struct {
				temp float32
				k    int
			}{{0, 0}, {1, 40}} {
				if _, err := cpu.SampleToken(l, tc.temp, tc.k, 0.5); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("CPU n=%d NaN at %v temp=%g: %v, want %q", n, at, tc.temp, err, want)
				}
				if _, err := g.SampleToken(gl, tc.temp, tc.k, 0.5); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("GPU n=%d NaN at %v temp=%g: %v, want %q", n, at, tc.temp, err, want)
				}
				p, err := g.SampleTokenTo(held, gl, tc.temp, tc.k, 0.5)
				if err != nil {
					t.Fatal(err)
				}
				g.EmbedToken(row, table, held)
				if _, err := p.Wait(); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("GPU held n=%d NaN at %v temp=%g: %v, want %q", n, at, tc.temp, err, want)
				}
			}
		}
	}
	l := randn(rng, 1000)
	want, _ := cpu.SampleToken(l, 0, 0, 0)
	if got, err := g.SampleToken(toGPU(g, l), 0, 0, 0); err != nil || got != want {
		t.Errorf("after the NaN picks: %d, %v; want %d", got, err, want)
	}
}

// TestSampleTokenTo holds the pipelined sampler to SampleToken: picks
// queued into a device word, several in flight before their ids are read,
// and the row of each pick gathered from that word by EmbedToken (queued
// after the pick, before the next one overwrites it) equal to Embed's.
func TestSampleTokenTo(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(21, 22))
	const vocab, width = 1000, 64
	h := hostWeight(rng, backend.BF16, vocab, width)
	h.Bias = nil
	wc, _ := c.Upload(h)
	wg, _ := g.Upload(h)
	held := g.NewBuffer(1)
	type pick struct {
		p    backend.PendingToken
		want int
		row  backend.Buffer
	}
	var picks []pick
	for i := range 12 {
		l := randn(rng, vocab)
		temp, k := float32(0), 0
		if i%2 == 1 {
			temp, k = 0.9, 40
		}
		u := rng.Float64()
		want, err := cpu.SampleToken(l, temp, k, u)
		if err != nil {
			t.Fatal(err)
		}
		p, err := g.SampleTokenTo(held, toGPU(g, l), temp, k, u)
		if err != nil {
			t.Fatal(err)
		}
		row := g.NewBuffer(width)
		g.EmbedToken(row, wg, held)
		picks = append(picks, pick{p, want, row})
	}
	for i, p := range picks {
		got, err := p.p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if got != p.want {
			t.Errorf("pick %d: %d, want %d", i, got, p.want)
		}
		want := make(cpu.Buffer, width)
		c.Embed(want, wc, []int32{int32(p.want)})
		if e := relErr(fromGPU(t, g, p.row), want); e > 1e-7 {
			t.Errorf("pick %d: the embedded row of the held token is off by %.3g", i, e)
		}
	}
	// A pick whose slot later picks reused is an error, not a wrong id.
	first, err := g.SampleTokenTo(held, toGPU(g, []float32{1, 2}), 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range sampleSlots {
		if _, err := g.SampleTokenTo(held, toGPU(g, []float32{1, 2}), 0, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := first.Wait(); err == nil {
		t.Error("a pick overwritten in its slot was read")
	}
	if _, err := g.SampleTokenTo(g.NewBuffer(2), toGPU(g, []float32{1, 2}), 0, 0, 0); err == nil {
		t.Error("a pick into a buffer of 2 elements accepted")
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestFreeWhileQueued drops a buffer right after queueing a copy from it and
// lets the collector run its cleanup before the queue launches: the memory
// must stay allocated (and not be handed to a new buffer) until then.
func TestFreeWhileQueued(t *testing.T) {
	g := newGPU(t)
	const n = 1 << 20
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	dst := g.NewBuffer(n)
	srcPtr := func() uint64 {
		src := toGPU(g, ones)
		g.Copy(dst, src) // queued, not launched
		return ptr(src)
	}()
	// Wait for the cleanup of src: its address deferred, or (the bug) freed.
	collected := func() bool {
		g.qmu.Lock()
		defer g.qmu.Unlock()
		g.mu.Lock()
		defer g.mu.Unlock()
		_, live := g.live[srcPtr]
		return !live || slices.Contains(g.freeLater, srcPtr)
	}
	for deadline := time.Now().Add(5 * time.Second); !collected(); {
		if time.Now().After(deadline) {
			t.Skip("the collector did not run src's cleanup")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	junk := g.NewBuffer(n) // would take src's address if it had been freed
	if got := fromGPU(t, g, dst); slices.ContainsFunc(got, func(v float32) bool { return v != 1 }) {
		t.Fatalf("the copy read a freed buffer: %v ...", got[:4])
	}
	g.mu.Lock()
	_, live := g.live[srcPtr]
	g.mu.Unlock()
	if live {
		t.Errorf("src still allocated after the queue launched")
	}
	runtime.KeepAlive(junk)
}

// TestGemmPick holds the NVFP4 GEMM's variant choice to its rule on an
// H100's 132 multiprocessors (no GPU needed): stages of 512 elements up to 16
// tokens where that grid leaves at most a fifth of them idle, up to 64 where
// the feature tiles alone do; two feature groups a warp past 64 tokens.
func TestGemmPick(t *testing.T) {
	for _, tc := range []struct {
		m, n, k int
		want    string
	}{
		{16, 14336, 4096, "gemm_nvfp4_k512_t16"}, // 112 tiles
		{4, 4096, 14336, "gemm_nvfp4_k512_t8"},   // 32 tiles x 4 splits
		{16, 6144, 4096, "gemm_nvfp4_k256_t16"},  // 48 tiles x 2 splits: 36 idle
		{32, 14336, 4096, "gemm_nvfp4_k512_t32"}, // 112 tiles on their own
		{64, 14336, 4096, "gemm_nvfp4_k512_t64"},
		{64, 4096, 14336, "gemm_nvfp4_k256_t64"}, // 32 tiles: only split
		{128, 14336, 4096, "gemm_nvfp4_k256_t64_f2"},
		{512, 4096, 14336, "gemm_nvfp4_k256_t64_f2"},
		{512, 4096, 640, "gemm_nvfp4_t64"},       // K % 256 != 0
		{16, 14336, 3840, "gemm_nvfp4_k256_t16"}, // K % 512 != 0
		{64, 4096, 640, "gemm_nvfp4_t64"},
	} {
		if got := gemmPick(tc.m, tc.n, tc.k, 132, false, false).name(); got != tc.want {
			t.Errorf("m %d, %d x %d: %s, want %s", tc.m, tc.n, tc.k, got, tc.want)
		}
	}
}

// TestReleasedOnGPU runs the repository's own fixtures (the released
// layouts of model/testdata: DeepSeek-V3 FP8, Qwen3-MoE, DeepSeek-V4 FP8 +
// MXFP4 and NVIDIA's NVFP4 experts) on the GPU and the CPU: logits within
// 2e-2, greedy tokens equal, as TestGoldenOnGPU.
func TestReleasedOnGPU(t *testing.T) {
	g := newGPU(t)
	var dirs []string
	for _, pattern := range []string{"golden/*", "golden/*/*", "deepseek_v4_released/*"} {
		m, _ := filepath.Glob(filepath.Join("..", "model", "testdata", pattern, "config.json"))
		for _, c := range m {
			dirs = append(dirs, filepath.Dir(c))
		}
	}
	if len(dirs) == 0 {
		t.Skip("no fixtures in model/testdata (gen_moe_fixtures.py, gen_v4_released.py)")
	}
	for _, dir := range dirs {
		ref := dir // golden.safetensors: the folder's own, or its parent's for a bf16/fp8 variant
		if _, err := os.Stat(filepath.Join(ref, "golden.safetensors")); err != nil {
			ref = filepath.Dir(dir)
		}
		t.Run(dir, func(t *testing.T) {
			d, same := compareModels(t, g, dir, golden.Load(t, ref).InputIDs, model.Options{})
			requireClose(t, d, same)
		})
	}
}

// refCPU is the CPU backend the GPU is held to: NVFP4 on its float32
// reference kernels (its default int8-activation kernels round x to 8
// bits, the GPU's to 16).
func refCPU() *cpu.Backend { return cpu.NewWithOptions(cpu.Options{ReferenceNVFP4: true}) }
