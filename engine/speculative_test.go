package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// withMTP copies the DeepSeek-V4 checkpoint src into a new folder and adds
// a random MTP block (mtp.0.*, float32) of its shapes after its tensors.
func withMTP(t testing.TB, src string, seed uint64) string {
	t.Helper()
	dst := t.TempDir()
	if b, err := os.ReadFile(filepath.Join(src, "generation_config.json")); err == nil {
		if err := os.WriteFile(filepath.Join(dst, "generation_config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var c struct {
		Hidden  int `json:"hidden_size"`
		Heads   int `json:"num_attention_heads"`
		HeadDim int `json:"head_dim"`
		QLora   int `json:"q_lora_rank"`
		OGroups int `json:"o_groups"`
		OLora   int `json:"o_lora_rank"`
		HC      int `json:"hc_mult"`
		Experts int `json:"n_routed_experts"`
		Inter   int `json:"moe_intermediate_size"`
	}
	cj, _ := os.ReadFile(filepath.Join(src, "config.json"))
	if err := json.Unmarshal(cj, &c); err != nil {
		t.Fatal(err)
	}
	var mtp []*weights.Tensor
	rng := rand.New(rand.NewPCG(seed, 9))
	add := func(name string, mean, std float64, shape ...int) {
		tn := &weights.Tensor{Name: name, DType: weights.F32, Shape: shape}
		tn.Data = testnum.NormalF32Bytes(rng, tn.NumElements(), mean, std)
		mtp = append(mtp, tn)
	}
	D, n, hq := c.Hidden, c.HC, c.Heads*c.HeadDim
	mix := (2 + n) * n
	p := "mtp.0."
	add(p+"attn_norm.weight", 1, 0.1, D)
	add(p+"ffn_norm.weight", 1, 0.1, D)
	for _, site := range []string{"hc_attn_", "hc_ffn_"} {
		add(p+site+"fn", 0, 0.05, mix, n*D)
		add(p+site+"base", 0, 0.3, mix)
		add(p+site+"scale", 1, 0.2, 3)
	}
	lin := func(name string, rows, cols int) { add(name, 0, 1/math.Sqrt(float64(cols)), rows, cols) }
	lin(p+"attn.wq_a.weight", c.QLora, D)
	add(p+"attn.q_norm.weight", 1, 0.1, c.QLora)
	lin(p+"attn.wq_b.weight", hq, c.QLora)
	lin(p+"attn.wkv.weight", c.HeadDim, D)
	add(p+"attn.norm.weight", 1, 0.1, c.HeadDim)
	lin(p+"attn.wo_a.weight", c.OGroups*c.OLora, hq/c.OGroups)
	lin(p+"attn.wo_b.weight", D, c.OGroups*c.OLora)
	add(p+"attn.attn_sink", 0, 1, c.Heads)
	lin(p+"ffn.gate.weight", c.Experts, D)
	add(p+"ffn.gate.bias", 0, 0.1, c.Experts)
	for e := 0; e < c.Experts; e++ {
		ep := fmt.Sprintf("%sffn.experts.%d.", p, e)
		lin(ep+"w1.weight", c.Inter, D)
		lin(ep+"w3.weight", c.Inter, D)
		lin(ep+"w2.weight", D, c.Inter)
	}
	lin(p+"ffn.shared_experts.w1.weight", c.Inter, D)
	lin(p+"ffn.shared_experts.w3.weight", c.Inter, D)
	lin(p+"ffn.shared_experts.w2.weight", D, c.Inter)
	lin(p+"e_proj.weight", D, D)
	lin(p+"h_proj.weight", D, D)
	for _, nm := range []string{"enorm", "hnorm", "norm"} {
		add(p+nm+".weight", 1, 0.1, D)
	}
	add(p+"hc_head_fn", 0, 0.1, n, n*D)
	add(p+"hc_head_base", 0, 0.3, n)
	add(p+"hc_head_scale", 1, 0.1, 1)
	ck, err := weights.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	last := ck.Names()[len(ck.Names())-1]
	ck.Close()
	err = testmodel.RewriteTensors(src, dst, func(_ *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		if tn.Name == last {
			return append([]*weights.Tensor{tn}, mtp...)
		}
		return []*weights.Tensor{tn}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// tinyV4MTP is a random DeepSeek-V4 checkpoint (NVFP4 layout) with its MTP
// block.
func tinyV4MTP(t testing.TB) string {
	d := testmodel.DeepseekV4{Vocab: 64, Hidden: 64, Layers: 3, Heads: 2, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16,
		Window: 5, RateCSA: 2, RateHCA: 4, IndexHeads: 2, IndexDim: 16, IndexTopK: 3, HCMult: 2, HCIters: 5,
		Experts: 4, TopK: 2, MoEFFN: 32, RopeDim: 8, HashLayers: 1, MTP: true, Seed: 3,
		LayerTypes: []string{testmodel.V4HCA, testmodel.V4CSA, testmodel.V4Sliding}}
	return testmodel.WriteTemp(t, d)
}

// TestSpeculativeGreedy: greedy generation with MTP drafts of 1 to 3
// tokens gives the tokens of plain greedy generation, on random V4 and V3
// checkpoints and on the V4 golden fixture (transformers' greedy tokens) with
// a random MTP block added.
func TestSpeculativeGreedy(t *testing.T) {
	check := func(t *testing.T, device, dir string, prompt, want []int) {
		n := 24
		if want != nil {
			n = len(want)
		}
		gen := func(o Options) ([]int, SpeculativeStats) {
			o.Device = device
			m, s := openSession(t, dir, o)
			res, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: n, StopTokens: []int{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if s.Len() != len(prompt)+n {
				t.Errorf("session holds %d tokens, want %d", s.Len(), len(prompt)+n)
			}
			// The session goes on as one long run would.
			more, err := s.Generate(context.Background(), nil, GenerateOptions{MaxTokens: 5, StopTokens: []int{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return append(res.Tokens, more.Tokens...), m.SpeculativeStats()
		}
		plain, _ := gen(Options{})
		if want != nil && !slices.Equal(plain[:n], want) {
			t.Fatalf("plain greedy %v, golden %v", plain[:n], want)
		}
		for k := 1; k <= 3; k++ {
			got, stats := gen(Options{Speculative: SpeculativeOptions{Mode: "on", Tokens: k}})
			if !slices.Equal(got, plain) {
				t.Errorf("k=%d: speculative greedy\n%v\nplain\n%v", k, got, plain)
			}
			if stats.Drafted == 0 {
				t.Errorf("k=%d: nothing drafted", k)
			}
			t.Logf("k=%d: %d steps, %d drafted, %d accepted", k, stats.Steps, stats.Drafted, stats.Accepted)
		}
	}
	for _, device := range []string{"cpu", "cuda"} {
		t.Run(device, func(t *testing.T) {
			if device == "cuda" && !kernels.Available() {
				t.Skip("no CUDA driver or GPU")
			}
			t.Run("random", func(t *testing.T) { check(t, device, tinyV4MTP(t), []int{0, 5, 9, 13, 2, 40, 7, 7, 30}, nil) })
			t.Run("v3", func(t *testing.T) {
				d := testmodel.DeepseekV3{Layers: 2, DenseLayers: 1, Hidden: 64, FFN: 96, Heads: 2, Vocab: 80, QLora: 32, KVLora: 32,
					Nope: 16, Rope: 8, VDim: 16, Experts: 4, Shared: 1, TopK: 2, MoEFFN: 32, Groups: 2, TopKGroups: 1, MTP: true, Seed: 3}
				check(t, device, testmodel.WriteTemp(t, d), []int{0, 5, 9, 13, 2, 40, 7, 7, 30}, nil)
			})
			t.Run("golden", func(t *testing.T) {
				dir := golden.Path(t, "deepseek_v4")
				ref := golden.Load(t, dir)
				check(t, device, withMTP(t, dir, 1), ints(ref.InputIDs[:20]), ints(ref.GreedyTokens))
			})
		})
	}
}

// TestSpeculateKeepsDistribution draws the token of speculative sampling
// many times (drafts from q, verified against p, both the sampler's
// distributions of random logits) and tests the counts against p with a
// chi-square test.
func TestSpeculateKeepsDistribution(t *testing.T) {
	const V, draws = 12, 200000
	rng := rand.New(rand.NewPCG(4, 4))
	for _, o := range []SamplingOptions{{Temperature: 1}, {Temperature: 0.7, TopK: 6}, {Temperature: 1.3, TopP: 0.9}} {
		t.Run(fmt.Sprintf("%+v", o), func(t *testing.T) {
			sampler := NewSampler(o)
			pl, ql := make([]float32, V), make([]float32, V)
			for i := range pl {
				pl[i], ql[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*1.5)
			}
			p, q := sampler.probs(slices.Clone(pl), nil), sampler.probs(slices.Clone(ql), nil)
			counts := make([]int, V)
			accepted := 0
			for i := 0; i < draws; i++ {
				d := drawDense(q, rng.Float64())
				tok, ok := speculate(p, q, d, rng.Float64, rng.Float64)
				counts[tok]++
				if ok {
					accepted++
				}
			}
			chi, dof := 0.0, -1
			for i, c := range counts {
				if p[i] == 0 {
					if c != 0 {
						t.Errorf("token %d outside p's support drawn %d times", i, c)
					}
					continue
				}
				e := p[i] * draws
				chi += (float64(c) - e) * (float64(c) - e) / e
				dof++
			}
			// The 0.999 quantile of chi-square is below dof + 4.5 sqrt(2 dof) + 10 for these dofs.
			if lim := float64(dof) + 4.5*math.Sqrt(2*float64(dof)) + 10; chi > lim {
				t.Errorf("chi-square %.1f over %d degrees of freedom (limit %.1f): the tokens are not distributed as p", chi, dof, lim)
			}
			t.Logf("acceptance %.3f, chi-square %.1f (dof %d)", float64(accepted)/draws, chi, dof)
		})
	}
}

// TestSpeculativeSampling generates with sampling and MTP drafts: the run
// completes with the tokens asked for, and bad options are refused.
func TestSpeculativeSampling(t *testing.T) {
	dir := tinyV4MTP(t)
	m, s := openSession(t, dir, Options{Device: "cpu", Speculative: SpeculativeOptions{Mode: "on", Tokens: 2}})
	res, err := s.Generate(context.Background(), []int{0, 3, 8}, GenerateOptions{MaxTokens: 20, StopTokens: []int{},
		Sampling: SamplingOptions{Temperature: 0.8, TopK: 20, Seed: 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tokens) != 20 || s.Len() != 23 {
		t.Errorf("%d tokens, session %d", len(res.Tokens), s.Len())
	}
	if m.SpeculativeStats().Drafted == 0 {
		t.Error("nothing drafted")
	}
	for _, o := range []SpeculativeOptions{{Mode: "sometimes"}, {Mode: "on", Tokens: -1}, {Mode: "on", Tokens: 99}} {
		if _, err := Load(dir, Options{Device: "cpu", Speculative: o}); err == nil || !strings.Contains(err.Error(), "Speculative") {
			t.Errorf("%+v: err = %v", o, err)
		}
	}
}

// oracleDrafter drafts the tokens of a known greedy run, every fifth position
// wrong, so that verify passes keep some drafts and reject others.
type oracleDrafter struct {
	model.Model
	seq []int
}

func (o oracleDrafter) CanDraft() bool { return true }

func (o oracleDrafter) Draft(ctx context.Context, st model.State, next int32, k int, pick func(int, []float32) (int32, error)) ([]int32, error) {
	var out []int32
	for i := 1; i <= k; i++ {
		p := st.Len() + i
		if p >= len(o.seq) || p >= st.Cap()-1 {
			break
		}
		t := int32(o.seq[p])
		if p%5 == 0 {
			t = (t + 1) % int32(o.Config().VocabSize)
		}
		out = append(out, t)
	}
	return out, nil
}

// TestSpeculativeAccepts runs the verify passes with drafts the main model
// partly agrees with: the output stays plain greedy's and the cache is
// rolled back past each rejected draft.
func TestSpeculativeAccepts(t *testing.T) {
	dir := tinyV4MTP(t)
	prompt := []int{0, 5, 9, 13, 2, 40, 7, 7, 30}
	const n = 30
	_, s := openSession(t, dir, Options{Device: "cpu"})
	plain, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: n, StopTokens: []int{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= 4; k++ {
		m, s := openSession(t, dir, Options{Device: "cpu", Speculative: SpeculativeOptions{Mode: "on", Tokens: k}})
		m.net = oracleDrafter{Model: m.net, seq: slices.Concat(prompt, plain.Tokens)}
		res, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: n, StopTokens: []int{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := m.SpeculativeStats()
		if !slices.Equal(res.Tokens, plain.Tokens) {
			t.Errorf("k=%d: %v, plain %v", k, res.Tokens, plain.Tokens)
		}
		if st.Accepted == 0 || st.Accepted == st.Drafted {
			t.Errorf("k=%d: %d of %d drafts accepted: want some of each", k, st.Accepted, st.Drafted)
		}
		t.Logf("k=%d: %d steps for %d tokens, acceptance %.2f", k, st.Steps, n, st.AcceptanceRate())
	}
}

// BenchmarkSpeculativeV4 decodes with and without MTP drafts on a random
// DeepSeek-V4 checkpoint (CPU: go test ./engine -run '^$' -bench
// SpeculativeV4/cpu; the cuda half skips without a GPU), reporting tokens/s and the acceptance rate, and times the
// main model's verify pass over n positions against one decode step
// ("verify-n").
func BenchmarkSpeculativeV4(b *testing.B) {
	for _, device := range []string{"cpu", "cuda"} {
		b.Run(device, func(b *testing.B) {
			if device == "cuda" && !kernels.Available() {
				b.Skip("no CUDA driver or GPU")
			}
			benchSpeculativeV4(b, device)
		})
	}
}

// loadPrefilled loads the model in dir with o and runs prompt through a
// fresh state of 256 positions, returning the model (for the caller to
// close), the state and the prompt's ids.
func loadPrefilled(b *testing.B, dir string, o Options, prompt []int) (*Model, model.State, []int32) {
	b.Helper()
	m, err := Load(dir, o)
	if err != nil {
		b.Fatal(err)
	}
	st, err := m.net.NewState(256)
	if err != nil {
		m.Close()
		b.Fatal(err)
	}
	ids := make([]int32, len(prompt))
	for i, t := range prompt {
		ids[i] = int32(t)
	}
	if _, err := m.net.Forward(context.Background(), st, ids, false); err != nil {
		m.Close()
		b.Fatal(err)
	}
	return m, st, ids
}

func benchSpeculativeV4(b *testing.B, device string) {
	var d testmodel.Writer = testmodel.DeepseekV4{Vocab: 4096, Hidden: 512, Layers: 6, Heads: 8, HeadDim: 64, QLora: 256, OGroups: 4, OLora: 128,
		Window: 64, IndexHeads: 4, IndexDim: 64, IndexTopK: 32, HCMult: 4, HCIters: 20, Experts: 16, TopK: 4, MoEFFN: 256,
		RopeDim: 16, HashLayers: 1, MTP: true, Seed: 5}
	// MANIFOLD_BENCH_SPEC_SHAPE names another testmodel shape with an MTP
	// block (deepseek-v4-bench-mtp: V4-Flash's layers with 32 experts).
	// MANIFOLD_BENCH_SPEC_DIR may name a folder for its checkpoint, reused
	// when it holds that shape's whole checkpoint (testmodel.Spec.Written:
	// as cmd/bench -random NAME -keep DIR or internal/testmodel/write leave
	// it), written there otherwise; the 26 GB of deepseek-v4-bench-mtp are
	// then written once for the V4 benchmarks (its config.json is
	// deepseek-v4-bench's, so MANIFOLD_BENCH_DIR can name the same folder).
	var dir string
	if name := os.Getenv("MANIFOLD_BENCH_SPEC_SHAPE"); name != "" {
		spec, err := testmodel.Shape(name)
		if err != nil {
			b.Fatal(err)
		}
		d = spec.Model
		if dir = os.Getenv("MANIFOLD_BENCH_SPEC_DIR"); dir != "" && !spec.Written(dir) {
			start := time.Now()
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			if err := spec.Write(dir); err != nil {
				b.Fatal(err)
			}
			b.Logf("wrote the %s checkpoint (%.1f GB) into %s in %s", name, float64(spec.CheckpointBytes())/1e9, dir, time.Since(start))
		}
	}
	if dir == "" {
		dir = testmodel.WriteTemp(b, d)
	}
	prompt := make([]int, 64)
	for i := range prompt {
		prompt[i] = (i*37 + 11) % 4096
	}
	const n = 32
	for _, k := range []int{0, 1, 2, 3} {
		name := "off"
		o := Options{Device: device}
		if k > 0 {
			name = fmt.Sprintf("k=%d", k)
			o.Speculative = SpeculativeOptions{Mode: "on", Tokens: k}
		}
		b.Run(name, func(b *testing.B) {
			m, err := Load(dir, o)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			var decode float64
			for i := 0; i < b.N; i++ {
				s, err := m.NewSession(256)
				if err != nil {
					b.Fatal(err)
				}
				res, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: n, StopTokens: []int{}}, nil)
				if err != nil {
					b.Fatal(err)
				}
				decode += res.DecodeDuration.Seconds()
			}
			b.ReportMetric(float64(b.N*(n-1))/decode, "tokens/s")
			b.ReportMetric(m.SpeculativeStats().AcceptanceRate(), "acceptance")
		})
	}
	for _, k := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("draft-k=%d", k), func(b *testing.B) {
			m, st, _ := loadPrefilled(b, dir, Options{Device: device, Speculative: SpeculativeOptions{Mode: "on", Tokens: k}}, prompt)
			defer m.Close()
			dr := m.net.(model.Drafter)
			greedy := func(_ int, l []float32) (int32, error) { return int32(layers.Argmax(l)), nil }
			if _, err := dr.Draft(context.Background(), st, 1, k, greedy); err != nil { // the prompt's catch-up
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ { // each redoes the last position and drafts k
				if _, err := dr.Draft(context.Background(), st, 1, k, greedy); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, k := range []int{1, 2, 3} {
		// A step of k drafts and its verify pass against a plain step, both
		// timed here, and the speed-up they imply at DeepSeek-V4's
		// published acceptance of 88%: a step keeps 1 + a + ... + a^k
		// tokens on average.
		b.Run(fmt.Sprintf("implied-k=%d", k), func(b *testing.B) {
			m, st, _ := loadPrefilled(b, dir, Options{Device: device, Speculative: SpeculativeOptions{Mode: "on", Tokens: k}}, prompt)
			defer m.Close()
			ctx := context.Background()
			dr := m.net.(model.Drafter)
			greedy := func(_ int, l []float32) (int32, error) { return int32(layers.Argmax(l)), nil }
			L := len(prompt)
			b.ResetTimer()
			var step, spec float64 // seconds, the two interleaved so that both see the same load
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := m.net.Forward(ctx, st, []int32{1}, false); err != nil {
					b.Fatal(err)
				}
				st.Truncate(L)
				mid := time.Now()
				drafts, err := dr.Draft(ctx, st, 1, k, greedy)
				if err != nil || len(drafts) != k {
					b.Fatalf("drafts %v, err %v", drafts, err)
				}
				if _, err := m.net.Forward(ctx, st, append([]int32{1}, drafts...), true); err != nil {
					b.Fatal(err)
				}
				st.Truncate(L)
				step += mid.Sub(start).Seconds()
				spec += time.Since(mid).Seconds()
			}
			step, spec = step/float64(b.N), spec/float64(b.N)
			const a = 0.88
			kept := (1 - math.Pow(a, float64(k+1))) / (1 - a)
			b.ReportMetric(step*1e3, "step-ms")
			b.ReportMetric(spec*1e3, "spec-step-ms")
			b.ReportMetric(kept/spec*step, "speedup@88%")
		})
	}
	for _, rows := range []int{1, 2, 3, 4} {
		b.Run(fmt.Sprintf("verify-n=%d", rows), func(b *testing.B) {
			m, st, ids := loadPrefilled(b, dir, Options{Device: device}, prompt)
			defer m.Close()
			step := ids[:rows]
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := m.net.Forward(context.Background(), st, step, true); err != nil {
					b.Fatal(err)
				}
				st.Truncate(len(prompt) + 1) // keep one: the next pass replays nothing past the last call
				st.Truncate(len(prompt))
			}
		})
	}
}

// TestSpeculativeSamplingDistribution samples the token after a prompt with
// MTP drafts many times (one seed each) and tests the counts against the
// model's distribution with a chi-square test: drafts accepted and
// rejected alike, the token is distributed as without them.
func TestSpeculativeSamplingDistribution(t *testing.T) {
	dir := tinyV4MTP(t)
	prompt := []int{0, 5, 9, 13, 2, 40, 7, 7, 30}
	opts := SamplingOptions{Temperature: 1.5, TopK: 12}
	m, s := openSession(t, dir, Options{Device: "cpu", Speculative: SpeculativeOptions{Mode: "on", Tokens: 2}})
	logits, err := s.Append(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	p := NewSampler(opts).probs(logits, prompt)
	s.Truncate(len(prompt) - 1)
	const draws = 3000
	counts := make([]int, len(p))
	for seed := range draws {
		o := opts
		o.Seed = uint64(seed)
		res, err := s.Generate(context.Background(), prompt[len(prompt)-1:], GenerateOptions{MaxTokens: 2, StopTokens: []int{}, Sampling: o}, nil)
		if err != nil {
			t.Fatal(err)
		}
		counts[res.Tokens[0]]++
		s.Truncate(len(prompt) - 1)
	}
	st := m.SpeculativeStats()
	if st.Accepted == 0 || st.Accepted == st.Drafted {
		t.Errorf("%d of %d drafts accepted: want some of each", st.Accepted, st.Drafted)
	}
	// Bins of expected count below 5 are pooled.
	chi, dof := 0.0, -1
	var poolE float64
	var poolC int
	for i, c := range counts {
		e := p[i] * draws
		if p[i] == 0 && c != 0 {
			t.Errorf("token %d outside the distribution's support drawn %d times", i, c)
		}
		if e < 5 {
			poolE, poolC = poolE+e, poolC+c
			continue
		}
		chi += (float64(c) - e) * (float64(c) - e) / e
		dof++
	}
	if poolE > 0 {
		chi += (float64(poolC) - poolE) * (float64(poolC) - poolE) / max(poolE, 1)
		dof++
	}
	if lim := float64(dof) + 4.5*math.Sqrt(2*float64(dof)) + 10; chi > lim {
		t.Errorf("chi-square %.1f over %d degrees of freedom (limit %.1f): the tokens are not distributed as the model's", chi, dof, lim)
	}
	t.Logf("%d verify passes, acceptance %.3f over %d drafts, chi-square %.1f (dof %d)", st.Steps, st.AcceptanceRate(), st.Drafted, chi, dof)
}
