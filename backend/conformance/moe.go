package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// moeCases are the routed experts of a MoE block: DeepSeek-V4's routing
// (RoutedMoEOps: scored top-k with sigmoid or sqrt-softplus, hashed picks,
// the SwiGLU limit), DeepSeek-V3's group-limited routing (GroupMoEOps) and
// Qwen3-MoE's softmax routing (SoftmaxMoEOps), over NVFP4 experts, FP8 ones
// (E8M0 and float32 tile scales) and bf16 ones, one token and several,
// widths multiples of 32 (what BindExperts takes) but not of the kernels'
// 16-row tiles' staging span of 1024 columns nor of 128. On the CUDA
// backend they launch moe_route / moe_group_route / moe_softmax_route, then
// moe_up and moe_down (NVFP4), moe_up_fp8 and moe_down_fp8 (FP8) or
// moe_up_bf16 and moe_down_bf16 (bf16). A backend without the op group (or
// whose BindExperts declines) runs the host path a model takes then: the
// route on the host and a MatMul per picked expert.
func moeCases() []Case {
	var cs []Case
	const (
		v4Route   = iota // dsv4.Route
		v3Route          // layers.GroupRoute
		qwenRoute        // layers.SoftmaxRoute
	)
	type moeShape struct {
		f                       backend.Format
		m, experts, k, dim, ffn int
		route                   int
		scoring                 dsv4.Scoring // v4Route's scores; qwenRoute: 1 normalizes the weights
		bias, hash              bool
		limit                   float32
		devHash                 bool // the hashed picks from a device buffer (DeviceHashMoEOps)
	}
	for _, s := range []moeShape{
		{backend.NVFP4, 1, 32, 6, 256, 96, v4Route, dsv4.ScoreSqrtSoftplus, false, false, 10, false},
		{backend.NVFP4, 3, 32, 6, 1056, 64, v4Route, dsv4.ScoreSigmoid, true, false, 0, false},
		{backend.NVFP4, 2, 8, 2, 128, 1088, v4Route, dsv4.ScoreSqrtSoftplus, false, true, 7, false},
		{backend.NVFP4, 2, 8, 2, 128, 1088, v4Route, dsv4.ScoreSqrtSoftplus, false, true, 7, true},
		{backend.NVFP4, 1, 32, 6, 256, 96, v3Route, 0, true, false, 0, false},
		{backend.NVFP4, 3, 64, 8, 160, 224, v3Route, 0, true, false, 0, false},
		{backend.FP8Block, 1, 32, 6, 320, 160, v3Route, 0, true, false, 0, false},
		{fp8BlockF32, 3, 16, 4, 256, 96, v3Route, 0, true, false, 0, false},
		{backend.FP8Block, 2, 32, 6, 448, 224, v4Route, dsv4.ScoreSqrtSoftplus, true, false, 0, false},
		// bf16 experts: Qwen3-MoE's as released (top 8 of 128, normalized),
		// and a V3 and a V4 checkpoint stored in bf16.
		{backend.BF16, 1, 128, 8, 256, 96, qwenRoute, 1, false, false, 0, false},
		{backend.BF16, 3, 16, 4, 1056, 160, qwenRoute, 0, false, false, 0, false},
		{backend.BF16, 2, 32, 6, 320, 224, v3Route, 0, true, false, 0, false},
		{backend.BF16, 2, 32, 6, 256, 96, v4Route, dsv4.ScoreSqrtSoftplus, false, false, 7, false},
	} {
		op, route := "RoutedMoEOps.RoutedMoE", fmt.Sprintf("scoring=%d/bias=%v/hash=%v/limit=%g", s.scoring, s.bias, s.hash, s.limit)
		switch {
		case s.route == v3Route:
			op, route = "GroupMoEOps.GroupMoE", "groups=4/top=2"
		case s.route == qwenRoute:
			op, route = "SoftmaxMoEOps.SoftmaxMoE", fmt.Sprintf("softmax/normalize=%v", s.scoring == 1)
		case s.devHash:
			op = "DeviceHashMoEOps.RoutedMoEDeviceHash"
		}
		needs := ""
		if s.f == backend.FP8Block || s.f == fp8BlockF32 {
			needs = "format:fp8block"
		}
		cs = append(cs, Case{Op: op, Shape: fmt.Sprintf("%s/m=%d/top-%d-of-%d/%dx%d/%s", formatName(s.f), s.m, s.k, s.experts, s.dim, s.ffn, route),
			Tol: 2e-5, Q8Tol: nvfp4Q8Tol, Needs: needs,
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				var w [3][]backend.Weight
				var v [3][][]float32
				for range s.experts {
					for j, sh := range [][2]int{{s.ffn, s.dim}, {s.ffn, s.dim}, {s.dim, s.ffn}} {
						wv, hw := weight(rng, s.f, sh[0], sh[1])
						up := must(b.Upload(hw))
						w[j], v[j] = append(w[j], up), append(v[j], wv)
					}
				}
				var bias []float32
				if s.bias {
					bias = rnd(rng, s.experts, 1)
				}
				var hash []int32
				if s.hash {
					for range s.m {
						for _, e := range rng.Perm(s.experts)[:s.k] {
							hash = append(hash, int32(e))
						}
					}
				}
				x, logits, shared := rnd(rng, s.m*s.dim, 1), rnd(rng, s.m*s.experts, 1), rnd(rng, s.m*s.dim, 1)
				ga := layers.GroupRouteArgs{M: s.m, Experts: s.experts, K: s.k, Groups: 4, TopKGroups: 2, Normalize: true, Scale: 2.5}
				va := dsv4.RouteArgs{M: s.m, Experts: s.experts, K: s.k, Scoring: s.scoring, Scale: 1.5}
				qa := layers.SoftmaxRouteArgs{M: s.m, Experts: s.experts, K: s.k, Normalize: s.scoring == 1}
				idx, wts := make([]int32, s.m*s.k), make([]float32, s.m*s.k)
				switch s.route {
				case v3Route:
					layers.GroupRoute(idx, wts, logits, bias, ga)
				case qwenRoute:
					layers.SoftmaxRoute(idx, wts, slices.Clone(logits), qa, nil) // (it overwrites the logits)
				default:
					dsv4.Route(idx, wts, logits, bias, hash, va)
				}
				want := append([]float32(nil), shared...)
				moeRef(want, x, v, idx, wts, s.m, s.k, s.dim, s.ffn, s.limit)

				out, xb := upload(b, shared), upload(b, x)
				var binder backend.ExpertBinder
				switch {
				case s.route == v3Route && caps.GroupMoE != nil:
					binder = caps.GroupMoE
				case s.route == qwenRoute && caps.SoftmaxMoE != nil:
					binder = caps.SoftmaxMoE
				case s.route == v4Route && caps.RoutedMoE != nil:
					binder = caps.RoutedMoE
				}
				if binder != nil {
					ex := must(binder.BindExperts(w[0], w[1], w[2], bias))
					if ex != nil {
						switch {
						case s.route == v3Route:
							caps.GroupMoE.GroupMoE(out, xb, upload(b, logits), ex, ga)
						case s.route == qwenRoute:
							caps.SoftmaxMoE.SoftmaxMoE(out, xb, upload(b, logits), ex, qa)
						case s.devHash && caps.DeviceHashMoE != nil:
							ids := make([]float32, len(hash))
							for i, e := range hash {
								ids[i] = math.Float32frombits(uint32(e))
							}
							caps.DeviceHashMoE.RoutedMoEDeviceHash(out, xb, upload(b, logits), upload(b, ids), ex, va, s.limit)
						default:
							caps.RoutedMoE.RoutedMoE(out, xb, upload(b, logits), hash, ex, va, s.limit)
						}
						return read(b, out), want
					}
				}
				moeHost(b, out, xb, w, idx, wts, s.m, s.k, s.dim, s.ffn, s.limit)
				return read(b, out), want
			}})
	}
	return cs
}

// moeRef adds to out each token's picked experts, in expert order, scaled by
// their weights: W2 SwiGLU(W1 x, W3 x, limit), the matmuls summed in float64.
func moeRef(out, x []float32, v [3][][]float32, idx []int32, wts []float32, m, k, dim, ffn int, limit float32) {
	g, u, a, y := make([]float32, ffn), make([]float32, ffn), make([]float32, ffn), make([]float32, dim)
	for i := range m {
		for _, j := range sortedPicks(idx[i*k : (i+1)*k]) {
			e := idx[i*k+j]
			refMatMul(g, x[i*dim:], v[0][e], nil, 1, ffn, dim, dim, ffn)
			refMatMul(u, x[i*dim:], v[1][e], nil, 1, ffn, dim, dim, ffn)
			layers.SwiGLU(a, g, u, limit)
			refMatMul(y, a, v[2][e], nil, 1, dim, ffn, ffn, dim)
			for c := range dim {
				out[i*dim+c] += wts[i*k+j] * y[c]
			}
		}
	}
}

// moeHost is the host path of a MoE block: a MatMul per picked expert,
// added in expert order with ScatterAddRows.
func moeHost(b backend.Backend, out, x backend.Buffer, w [3][]backend.Weight, idx []int32, wts []float32, m, k, dim, ffn int, limit float32) {
	g, u, y := b.NewBuffer(ffn), b.NewBuffer(ffn), b.NewBuffer(dim)
	for i := range m {
		xi := b.View(x, i*dim, dim)
		for _, j := range sortedPicks(idx[i*k : (i+1)*k]) {
			e := idx[i*k+j]
			b.MatMul(g, xi, w[0][e], 1)
			b.MatMul(u, xi, w[1][e], 1)
			b.SwiGLU(g, g, u, limit)
			b.MatMul(y, g, w[2][e], 1)
			b.ScatterAddRows(out, y, []int32{int32(i)}, []float32{wts[i*k+j]}, dim)
		}
	}
}

// sortedPicks returns the positions of picks in increasing expert order.
func sortedPicks(picks []int32) []int {
	ord := make([]int, len(picks))
	for i := range ord {
		ord[i] = i
	}
	for i := 1; i < len(ord); i++ {
		for j := i; j > 0 && picks[ord[j]] < picks[ord[j-1]]; j-- {
			ord[j], ord[j-1] = ord[j-1], ord[j]
		}
	}
	return ord
}
