package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// Issue 11's benchmarks: each op's device time against its bandwidth floor
// (the bytes that must move divided by CopyBandwidth, measured in the same
// process), DSA sparse decode against dense MLA decode over the same cache,
// and htree decode attention against dense flash-decoding. Times are
// deviceTime's (CUDA events around iters queued runs, so launch and queueing
// gaps count). Caches are filled with random data directly. Run on the device
// machine, in kernels/, with dev/torch/bench_mhc_torch.py for the PyTorch eager mHC:
//
//	kernels.test -test.run '^$' -test.bench 'OpsFloor|OpsVsDense' -test.benchtime 3x

func floorGPU(b *testing.B) (*Backend, float64) {
	g := newGPU(b)
	bw := g.CopyBandwidth()
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	return g, bw
}

// fillRandom writes n random values at p, tiling one random block of at most
// 1<<22 values (host generation stays short at 128k contexts).
func fillRandom(g *Backend, rng *rand.Rand, p uint64, n int) {
	tile := randn(rng, min(n, 1<<22))
	for off := 0; off < n; off += len(tile) {
		w := min(len(tile), n-off)
		g.Write(&Buffer{ptr: p + uint64(4*off), n: w}, 0, tile[:w])
	}
}

// timeOp runs fn b.N times (warm-up, graph capture) and then reports
// deviceTime over iters runs as dev-us, with the floor for bytes at bw.
func timeOp(b *testing.B, g *Backend, bw float64, iters int, bytes float64, fn func()) time.Duration {
	for range b.N {
		fn()
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	d := deviceTime(g, iters, fn)
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	floor := bytes / bw
	b.ReportMetric(float64(d.Nanoseconds())/1e3, "dev-us")
	if bytes > 0 {
		b.ReportMetric(floor*1e6, "floor-us")
		b.ReportMetric(100*floor/d.Seconds(), "%floor")
	}
	return d
}

func BenchmarkOpsFloorMHC(b *testing.B) {
	g, bw := floorGPU(b)
	b.Logf("copy bandwidth %.0f GB/s", bw/1e9)
	rng := rand.New(rand.NewPCG(11, 1))
	m := newMHCBench(b, g, rng)
	n, C, mix := mhcBenchN, mhcBenchC, m.mix
	for _, rows := range []int{1, 2, 4, 8, 16, 32, 64, 8192} {
		r := m.rows(g, rows)
		out := toGPU(g, randn(rng, rows*C))
		nx := g.NewBuffer(rows * n * C)
		// coefficients + pre: the stream read once, the projection weight
		// (bf16) once, the layer input written.
		b.Run(fmt.Sprintf("B=%d/coeffs+pre", rows), func(b *testing.B) {
			bytes := float64(4*rows*n*C + 2*mix*n*C + 4*rows*C)
			timeOp(b, g, bw, r.iters, bytes, func() {
				g.MHCProject(r.logits, r.x, m.w, rows, 1e-6)
				g.MHCActivate(m.mx, r.pre, r.post, r.res, r.logits, m.base, m.scale, rows)
				g.MHCPre(r.dst, r.x, r.pre, rows, n, C)
			})
		})
		// The same through MHCCoeffsPre, as the V4 model calls it: one
		// launch up to mhcTailRows tokens.
		b.Run(fmt.Sprintf("B=%d/coeffs+pre-op", rows), func(b *testing.B) {
			bytes := float64(4*rows*n*C + 2*mix*n*C + 4*rows*C)
			timeOp(b, g, bw, r.iters, bytes, func() {
				g.MHCCoeffsPre(m.mx, r.dst, r.pre, r.post, r.res, r.logits, r.x, m.w, m.base, m.scale, rows)
			})
		})
		b.Run(fmt.Sprintf("B=%d/coeffs", rows), func(b *testing.B) {
			timeOp(b, g, bw, r.iters, float64(4*rows*n*C+2*mix*n*C), func() {
				g.MHCProject(r.logits, r.x, m.w, rows, 1e-6)
				g.MHCActivate(m.mx, r.pre, r.post, r.res, r.logits, m.base, m.scale, rows)
			})
		})
		b.Run(fmt.Sprintf("B=%d/pre", rows), func(b *testing.B) {
			timeOp(b, g, bw, 20, float64(4*rows*(n+1)*C), func() { g.MHCPre(r.dst, r.x, r.pre, rows, n, C) })
		})
		// post: the stream and the layer output read, the new stream written.
		b.Run(fmt.Sprintf("B=%d/post", rows), func(b *testing.B) {
			timeOp(b, g, bw, 20, float64(4*rows*(2*n+1)*C), func() { g.MHCPost(nx, r.x, out, r.post, r.res, rows, n, C) })
		})
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// allIndices is a selection of positions 0..k-1 for one query: the dense
// path through the sparse kernel.
func allIndices(b *testing.B, g *Backend, s dsa.IndexerShape, k int) *dsaIndices {
	x := &dsaIndices{shape: s}
	if err := g.grow(&x.sel, &x.selCap, k); err != nil {
		b.Fatal(err)
	}
	if err := g.grow(&x.cnt, &x.cntCap, 1); err != nil {
		b.Fatal(err)
	}
	v := make([]float32, k)
	for i := range v {
		v[i] = math.Float32frombits(uint32(i))
	}
	g.Write(&Buffer{a: x.sel, ptr: x.sel.ptr, n: k}, 0, v)
	g.Write(&Buffer{a: x.cnt, ptr: x.cnt.ptr, n: 1}, 0, []float32{math.Float32frombits(uint32(k))})
	x.rows, x.k = 1, k
	return x
}

// BenchmarkOpsVsDenseDSA: one decode query at V3.2 shapes. sparse = IndexerSelect
// (indexer scores + exact top-k 2048) + SparseLatentAttention over the selection;
// dense = SparseLatentAttention over every position (in chunks of at most 32768
// keys, the kernel's shared-memory bound on one selection; the chunks' merge
// is not counted).
func BenchmarkOpsVsDenseDSA(b *testing.B) {
	s := layers.MLAShape{Heads: 128, QLoraRank: 1536, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128}
	ix := dsa.IndexerShape{Heads: 64, HeadDim: 128, RopeDim: 64, TopK: 2048}
	g, bw := floorGPU(b)
	b.Logf("copy bandwidth %.0f GB/s", bw/1e9)
	rng := rand.New(rand.NewPCG(11, 2))
	const chunk = 32768
	rowBytes := float64(4 * (s.KVLoraRank + s.RopeDim))
	for _, L := range []int{8192, 32768, 131072} {
		q := toGPU(g, randn(rng, s.Heads*s.QKDim()))
		qLat := toGPU(g, randn(rng, s.Heads*s.KVLoraRank))
		lat, kr, ik := g.NewBuffer(L*s.KVLoraRank), g.NewBuffer(L*s.RopeDim), g.NewBuffer(L*ix.HeadDim)
		fillRandom(g, rng, ptr(lat), L*s.KVLoraRank)
		fillRandom(g, rng, ptr(kr), L*s.RopeDim)
		fillRandom(g, rng, ptr(ik), L*ix.HeadDim)
		iq := toGPU(g, randn(rng, ix.Heads*ix.HeadDim))
		// IndexerSelect scales the weights in place (as the model's per-token
		// buffer): each call selects with a fresh copy, or repeated calls
		// would drive them to zero and every score into one tie.
		iw0, iw := toGPU(g, randn(rng, ix.Heads)), g.NewBuffer(ix.Heads)
		g.Copy(iw, iw0)
		out := g.NewBuffer(s.Heads * s.KVLoraRank)
		idx, err := g.NewIndices(ix)
		if err != nil {
			b.Fatal(err)
		}
		g.IndexerSelect(idx, iq, iw, ik, 1, L, L-1)
		all := allIndices(b, g, ix, min(L, chunk))
		name := fmt.Sprintf("ctx=%d/", L)
		attendBytes := float64(ix.TopK) * rowBytes
		selectBytes := float64(4 * L * ix.HeadDim)
		b.Run(name+"select", func(b *testing.B) {
			timeOp(b, g, bw, 10, selectBytes, func() { g.Copy(iw, iw0); g.IndexerSelect(idx, iq, iw, ik, 1, L, L-1) })
		})
		b.Run(name+"attend", func(b *testing.B) {
			timeOp(b, g, bw, 10, attendBytes, func() { g.SparseLatentAttention(out, qLat, q, lat, kr, idx, 1, s, 0.1) })
		})
		// The indexer on CUDA-core FMAs (idx_scores_tile, before idx_scores_mma).
		b.Run(name+"select-tile", func(b *testing.B) {
			g.force.idxMMAOff = true
			defer func() { g.force.idxMMAOff = false }()
			timeOp(b, g, bw, 10, selectBytes, func() { g.Copy(iw, iw0); g.IndexerSelect(idx, iq, iw, ik, 1, L, L-1) })
		})
		b.Run(name+"select-tkm", func(b *testing.B) {
			g.force.topkPath = topkMany
			defer func() { g.force.topkPath = topkAuto }()
			timeOp(b, g, bw, 10, selectBytes, func() { g.Copy(iw, iw0); g.IndexerSelect(idx, iq, iw, ik, 1, L, L-1) })
		})
		// The attend over the first 512 and 1024 positions (one and two tiles
		// a block): how its time grows with the tiles.
		for _, k := range []int{512, 1024} {
			first := allIndices(b, g, ix, k)
			b.Run(fmt.Sprintf("%sattend-k%d", name, k), func(b *testing.B) {
				timeOp(b, g, bw, 10, float64(k)*rowBytes, func() { g.SparseLatentAttention(out, qLat, q, lat, kr, first, 1, s, 0.1) })
			})
		}
		// The attend in 8-warp blocks (dsa_attend_mma, before dsa_attend_mma16).
		b.Run(name+"attend-8w", func(b *testing.B) {
			g.force.attnMMA8 = true
			defer func() { g.force.attnMMA8 = false }()
			timeOp(b, g, bw, 10, attendBytes, func() { g.SparseLatentAttention(out, qLat, q, lat, kr, idx, 1, s, 0.1) })
		})
		// The attend on CUDA-core FMAs (dsa_attend_split, before dsa_attend_mma).
		b.Run(name+"attend-split", func(b *testing.B) {
			g.force.attnMMAOff = true
			defer func() { g.force.attnMMAOff = false }()
			timeOp(b, g, bw, 10, attendBytes, func() { g.SparseLatentAttention(out, qLat, q, lat, kr, idx, 1, s, 0.1) })
		})
		// sparse, then the same with the 8-warp attend, with the cluster
		// top-k in clusters of 8 (where 16 would run), with the top-k's
		// many-block passes (tkm_, before tkc_select) and with one block per
		// row (topk_select, before those).
		for _, v := range []struct {
			name  string
			path  int
			eight bool // the 8-warp attend
			tkc8  bool // the cluster top-k in clusters of 8
		}{{"sparse", topkAuto, false, false}, {"sparse-8w", topkAuto, true, false}, {"sparse-tkc8", topkAuto, false, true},
			{"sparse-tkm", topkMany, false, false}, {"sparse-1block", topkOneBlock, false, false}} {
			b.Run(name+v.name, func(b *testing.B) {
				g.force.topkPath, g.force.attnMMA8, g.force.tkc8 = v.path, v.eight, v.tkc8
				defer func() { g.force.topkPath, g.force.attnMMA8, g.force.tkc8 = topkAuto, false, false }()
				timeOp(b, g, bw, 10, selectBytes+attendBytes, func() {
					g.Copy(iw, iw0)
					g.IndexerSelect(idx, iq, iw, ik, 1, L, L-1)
					g.SparseLatentAttention(out, qLat, q, lat, kr, idx, 1, s, 0.1)
				})
			})
		}
		b.Run(name+"dense", func(b *testing.B) {
			timeOp(b, g, bw, 3, float64(L)*rowBytes, func() {
				for c0 := 0; c0 < L; c0 += chunk {
					k := min(chunk, L-c0)
					g.SparseLatentAttention(out, qLat, q, g.View(lat, c0*s.KVLoraRank, k*s.KVLoraRank),
						g.View(kr, c0*s.RopeDim, k*s.RopeDim), all, 1, s, 0.1)
				}
			})
		})
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpsVsDenseHTree: one decode step of one layer (32 query heads, 8
// KV heads of 128) at position L-1 over a cache holding L-1 random
// positions: htree (default options) against Backend.Attention's
// flash-decoding. The dense cache is built directly, past NewKVCache's
// single-block capacity bound, which the split path does not need.
func BenchmarkOpsVsDenseHTree(b *testing.B) {
	as := layers.AttentionShape{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 1 / float32(math.Sqrt(128))}
	g, bw := floorGPU(b)
	b.Logf("copy bandwidth %.0f GB/s", bw/1e9)
	rng := rand.New(rand.NewPCG(11, 3))
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 500000}, as.HeadDim)
	if err != nil {
		b.Fatal(err)
	}
	row := as.KVHeads * as.HeadDim
	for _, L := range []int{32768, 131072} {
		q := toGPU(g, randn(rng, as.Heads*as.HeadDim))
		k, v := toGPU(g, randn(rng, row)), toGPU(g, randn(rng, row))
		out := g.NewBuffer(as.Heads * as.HeadDim)

		hc, err := g.NewTreeCache(htree.CacheShape{Layers: 1, KVHeads: as.KVHeads, HeadDim: as.HeadDim, Capacity: L, RoPE: rope})
		if err != nil {
			b.Fatal(err)
		}
		c := hc.(*htreeCache)
		fillRandom(g, rng, c.k[0].ptr, c.nodes*row)
		fillRandom(g, rng, c.v[0].ptr, c.nodes*row)
		c.n[0] = L - 1

		dc := &kvCache{shape: backend.KVShape{Layers: 1, KVHeads: as.KVHeads, HeadDim: as.HeadDim, Capacity: L}, n: []int{L - 1}}
		for range 2 {
			a, err := g.alloc(4 * L * row)
			if err != nil {
				b.Fatal(err)
			}
			fillRandom(g, rng, a.ptr, L*row)
			if dc.k == nil {
				dc.k = []*allocation{a}
			} else {
				dc.v = []*allocation{a}
			}
		}
		kvBytes := float64(2 * 4 * L * row)
		name := fmt.Sprintf("ctx=%d/", L)
		b.Run(name+"htree", func(b *testing.B) {
			timeOp(b, g, bw, 10, 0, func() { g.TreeAttention(out, q, k, v, hc, 0, L-1, 1, as) })
		})
		b.Run(name+"dense", func(b *testing.B) {
			timeOp(b, g, bw, 10, kvBytes, func() { g.Attention(out, q, k, v, dc, 0, L-1, 1, as) })
		})
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpsV4Attention: DeepSeek-V4's attention for one decode query at
// its shapes (64 heads of 512, window 128, CSA's 512 selected entries of a
// 4096-token context, or HCA's 32 entries at rate 128), v4_attention_mma
// against v4_attention4 (mma off) in the same process; the floor counts the
// key rows read once.
func BenchmarkOpsV4Attention(b *testing.B) {
	g, bw := floorGPU(b)
	rng := rand.New(rand.NewPCG(11, 4))
	const heads, dim, window, ctx = 64, 512, 128, 4096
	for _, tc := range []struct {
		name              string
		rate, topk, count int
	}{{"csa", 4, 512, ctx / 4}, {"hca", 128, 0, ctx / 128}} {
		a := dsv4.AttnArgs{M: 1, Heads: heads, Dim: dim, Pos0: ctx - 1, Lo: ctx - window, Window: window,
			Rate: tc.rate, TopK: tc.topk, Entries: tc.count, Scale: float32(1 / math.Sqrt(dim))}
		q, local := toGPU(g, randn(rng, heads*dim)), toGPU(g, randn(rng, window*dim))
		comp, sinks := toGPU(g, randn(rng, tc.count*dim)), toGPU(g, randn(rng, heads))
		var idx backend.Buffer
		if tc.topk > 0 {
			v := make([]float32, tc.topk)
			for i := range v {
				v[i] = float32(rng.IntN(tc.count))
			}
			idx = toGPU(g, v)
		}
		out := g.NewBuffer(heads * dim)
		bytes := float64(4 * a.MaxKeys() * dim)
		for _, off := range []bool{false, true} {
			name := tc.name + "/mma"
			if off {
				name = tc.name + "/v4_attention4"
			}
			b.Run(name, func(b *testing.B) {
				g.force.attnMMAOff = off
				defer func() { g.force.attnMMAOff = false }()
				timeOp(b, g, bw, 20, bytes, func() { g.CompressedAttention(out, q, local, comp, idx, sinks, a) })
			})
		}
	}
}

// BenchmarkOpsV4MoE: one decode token through DeepSeek-V4's routed experts
// (32 NVFP4 experts of 4096 -> 2048 -> 4096, top-6, sqrt-softplus scores
// with a bias): the device MoE (moe_route, moe_up, moe_down) against the
// host path the model used before (router logits read back, dsv4.Route,
// then per picked expert two MatMuls, SwiGLU, a MatMul and a scatter-add).
// The floor counts the picked experts' weights read once.
func BenchmarkOpsV4MoE(b *testing.B) {
	g, bw := floorGPU(b)
	rng := rand.New(rand.NewPCG(11, 5))
	const E, K, D, I = 32, 6, 4096, 2048
	ws, _ := moeTestExperts(b, g, nil, rng, E, D, I)
	w1, w3, w2 := ws[0], ws[1], ws[2]
	bias := randn(rng, E)
	ex, err := g.BindExperts(w1, w3, w2, bias)
	if err != nil || ex == nil {
		b.Fatalf("BindExperts: %v, %v", ex, err)
	}
	a := dsv4.RouteArgs{M: 1, Experts: E, K: K, Scoring: dsv4.ScoreSqrtSoftplus, Scale: 1.5}
	x, logits, out := toGPU(g, randn(rng, D)), toGPU(g, randn(rng, E)), g.NewBuffer(D)
	bytes := float64(K*3*I*D) * 9 / 16 // E2M1 nibbles and one E4M3 scale per 16
	b.Run("device", func(b *testing.B) {
		timeOp(b, g, bw, 20, bytes, func() { g.RoutedMoE(out, x, logits, nil, ex, a, 10) })
	})
	ge, ue, ye := g.NewBuffer(I), g.NewBuffer(I), g.NewBuffer(D)
	host, idx, wts := make([]float32, E), make([]int32, K), make([]float32, K)
	b.Run("host", func(b *testing.B) {
		timeOp(b, g, bw, 20, bytes, func() {
			g.Read(host, logits, 0)
			dsv4.Route(idx, wts, host, bias, nil, a)
			for j, e := range idx {
				g.MatMul(ge, x, w1[e], 1)
				g.MatMul(ue, x, w3[e], 1)
				g.SwiGLU(ge, ge, ue, 10)
				g.MatMul(ye, ge, w2[e], 1)
				g.ScatterAddRows(out, ye, []int32{0}, wts[j:j+1], D)
			}
		})
	})
}
