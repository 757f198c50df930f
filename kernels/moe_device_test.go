package kernels

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// TestSoftmaxMoE holds the device MoE over bf16 experts with Qwen3-MoE's
// routing (moe_softmax_route, moe_up_bf16, moe_down_bf16) to
// layers.SoftmaxRoute and the host path on the CPU backend: normalized and
// not, one token and several, Qwen3-30B-A3B's top 8 of 128 and a width off
// the 1024-column staging span. It checks that the experts are bound as
// bf16, since a decline would leave the model on its host path silently.
// Tolerance as TestGroupMoE.
func TestSoftmaxMoE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(58, 30))
	for _, tc := range []struct {
		a        layers.SoftmaxRouteArgs
		dim, ffn int
	}{
		{layers.SoftmaxRouteArgs{M: 1, Experts: 128, K: 8, Normalize: true}, 256, 96},
		{layers.SoftmaxRouteArgs{M: 3, Experts: 16, K: 4, Normalize: false}, 1056, 160},
		{layers.SoftmaxRouteArgs{M: 8, Experts: 32, K: 6, Normalize: true}, 128, 1088},
	} {
		a := tc.a
		name := fmt.Sprintf("softmax moe %+v, dim %d, ffn %d", a, tc.dim, tc.ffn)
		var gw, cw [3][]backend.Weight
		for range a.Experts {
			for j, shape := range [][2]int{{tc.ffn, tc.dim}, {tc.ffn, tc.dim}, {tc.dim, tc.ffn}} {
				h := hostWeight(rng, backend.BF16, shape[0], shape[1])
				h.Bias = nil
				wc, wg := uploadBoth(t, g, c, h)
				gw[j], cw[j] = append(gw[j], wg), append(cw[j], wc)
			}
		}
		x, logits, res := randn(rng, a.M*tc.dim), randn(rng, a.M*a.Experts), randn(rng, a.M*tc.dim)
		idx, w := make([]int32, a.M*a.K), make([]float32, a.M*a.K)
		layers.SoftmaxRoute(idx, w, slices.Clone(logits), a, nil)
		want := slices.Clone(res)
		moeHostAdd(c, cw, want, x, idx, w, a.M, a.K, tc.dim, tc.ffn, 0)

		ex, err := g.BindExperts(gw[0], gw[1], gw[2], nil)
		if err != nil || ex == nil {
			t.Fatalf("%s: BindExperts: %v, %v", name, ex, err)
		}
		if !ex.(*moeExperts).bf16 {
			t.Fatalf("%s: experts not bound as bf16", name)
		}
		out := toGPU(g, res)
		g.SoftmaxMoE(out, toGPU(g, x), toGPU(g, logits), ex, a)
		check(t, name, fromGPU(t, g, out), want, opsTol)
	}
}

// TestMoEDecodeOnGPU decodes small checkpoints in the released MoE layouts,
// at widths the device MoE takes (multiples of 32), on the GPU and on the
// CPU backend: Qwen3-MoE in bf16 (its experts through SoftmaxMoE) and
// DeepSeek-V3 in FP8 (GroupMoE; the latent attention's queries and keys
// gathered, not copied head by head). The logits of a prompt and of each
// decode step after it agree within 2e-2 (requireClose's bound), and one
// decode step, profiled, launches what the device path launches: for Qwen3-MoE
// moe_softmax_route once a layer and no host-path gather or scatter, for
// DeepSeek-V3 two copy_words a layer at most (the cache appends of the
// generic attention). It logs a step's launches by kernel.
func TestMoEDecodeOnGPU(t *testing.T) {
	g := newGPU(t)
	for _, tc := range []struct {
		name  string
		m     testmodel.Model
		check func(t *testing.T, launches map[string]int)
	}{
		{"qwen3_moe", testmodel.Qwen3MoE{Layers: 2, Hidden: 128, Heads: 4, KVHeads: 2, HeadDim: 32, Vocab: 256, FFN: 96,
			Experts: 16, TopK: 4, MoEFFN: 64, DType: weights.BF16, Seed: 5},
			func(t *testing.T, n map[string]int) {
				if n["moe_softmax_route"] != 2 || n["moe_up_bf16"] != 2 || n["moe_down_bf16"] != 2 || n["rows_gather"]+n["rows_scatter_add"] != 0 {
					t.Errorf("a decode step launched moe_softmax_route %d, moe_up_bf16 %d, moe_down_bf16 %d, rows_gather %d, rows_scatter_add %d times; want 2, 2, 2, 0, 0",
						n["moe_softmax_route"], n["moe_up_bf16"], n["moe_down_bf16"], n["rows_gather"], n["rows_scatter_add"])
				}
			}},
		{"deepseek_v3", testmodel.DeepseekV3{Layers: 2, DenseLayers: 1, Hidden: 256, FFN: 192, Heads: 4, Vocab: 256,
			QLora: 64, KVLora: 64, Nope: 32, Rope: 32, VDim: 32, Experts: 16, Shared: 1, TopK: 4, MoEFFN: 64,
			Groups: 4, TopKGroups: 2, FP8: true, Seed: 6},
			func(t *testing.T, n map[string]int) {
				if n["moe_group_route"] != 1 || n["moe_up_fp8"] != 1 || n["copy_words"] > 4 {
					t.Errorf("a decode step launched moe_group_route %d, moe_up_fp8 %d, copy_words %d times; want 1, 1, at most 4",
						n["moe_group_route"], n["moe_up_fp8"], n["copy_words"])
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.m.Write(dir); err != nil {
				t.Fatal(err)
			}
			f, err := model.ReadFolder(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ctx := context.Background()
			ids := []int32{3, 17, 200, 9, 64, 5, 101, 33, 250, 7, 12, 90}
			steps := []int32{4, 77, 130, 8, 19, 222}
			var logits [2][][]float32
			for i, be := range []backend.Backend{g, refCPU()} {
				m, err := model.Build(be, f, model.Options{})
				if err != nil {
					t.Fatal(err)
				}
				st, err := m.NewState(len(ids) + len(steps))
				if err != nil {
					t.Fatal(err)
				}
				l, err := m.Forward(ctx, st, ids, false)
				if err != nil {
					t.Fatal(err)
				}
				logits[i] = append(logits[i], l)
				for j, tok := range steps {
					if i == 0 && j == len(steps)-1 {
						g.StartProfile()
					}
					if l, err = m.Forward(ctx, st, []int32{tok}, false); err != nil {
						t.Fatal(err)
					}
					if i == 0 && j == len(steps)-1 {
						launches, total := map[string]int{}, 0
						var names []string
						for _, k := range g.StopProfile() {
							launches[k.Name] += k.Launches
							total += k.Launches
							names = append(names, fmt.Sprintf("%s %d", k.Name, k.Launches))
						}
						t.Logf("a decode step: %d launches (%s)", total, strings.Join(names, ", "))
						tc.check(t, launches)
					}
					logits[i] = append(logits[i], l)
				}
			}
			for j := range logits[0] {
				d := 0.0
				for k, v := range logits[0][j] {
					d = max(d, math.Abs(float64(v-logits[1][j][k])))
				}
				if d > 2e-2 || math.IsNaN(d) {
					t.Errorf("pass %d: GPU logits differ from the CPU backend's by %.3g > 2e-2", j, d)
				}
			}
			checkForwardSampled(t, g, f, ids)
		})
	}
}

// checkForwardSampled runs the engine's pipelined decode by hand on the
// GPU: the prompt's logits left on the device (ForwardDevice), the greedy
// pick kept there (SampleTokenTo), the picked token run before its id is read
// (ForwardSampled), and holds that step's logits to those of the prompt and
// then the id run by Forward on a fresh state (the same kernels).
func checkForwardSampled(t *testing.T, g *Backend, f *model.Folder, ids []int32) {
	t.Helper()
	ctx := context.Background()
	m, err := model.Build(g, f, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := m.(model.SampledForwarder)
	if !ok {
		t.Fatalf("%T is not a model.SampledForwarder", m)
	}
	st, _ := m.NewState(len(ids) + 1)
	logits, err := sf.ForwardDevice(ctx, st, ids)
	if err != nil {
		t.Fatal(err)
	}
	held := g.NewBuffer(1)
	pick, err := g.SampleTokenTo(held, logits, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	next, err := sf.ForwardSampled(ctx, st, held)
	if err != nil {
		t.Fatal(err)
	}
	id, err := pick.Wait()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, next.Len())
	g.Read(got, next, 0)
	st2, _ := m.NewState(len(ids) + 1)
	if _, err := m.Forward(ctx, st2, ids, false); err != nil {
		t.Fatal(err)
	}
	want, err := m.Forward(ctx, st2, []int32{int32(id)}, false)
	if err != nil {
		t.Fatal(err)
	}
	d := 0.0
	for k, v := range got {
		d = max(d, math.Abs(float64(v-want[k])))
	}
	if d > 1e-5 || math.IsNaN(d) || st.Len() != len(ids)+1 {
		t.Errorf("ForwardSampled of token %d: logits %.3g from Forward's (state of %d positions, want %d)", id, d, st.Len(), len(ids)+1)
	}
}
