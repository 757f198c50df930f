package engine

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/model"
)

// heldCPU is the CPU backend with backend.TokenPipeliner's calls done on the
// host (the id kept in a buffer as its bits), so that the engine's pipelined
// generation runs without a GPU.
type heldCPU struct {
	*cpu.Backend
	held *int // EmbedToken calls: runs of held tokens
}

type heldPick int

func (p heldPick) Wait() (int, error) { return int(p), nil }

func (h heldCPU) SampleToken(logits backend.Buffer, temperature float32, topK int, u float64) (int, error) {
	return cpu.SampleToken(logits.(cpu.Buffer), temperature, topK, u)
}

func (h heldCPU) SampleTokenTo(dst, logits backend.Buffer, temperature float32, topK int, u float64) (backend.PendingToken, error) {
	id, err := h.SampleToken(logits, temperature, topK, u)
	if err != nil {
		return nil, err
	}
	dst.(cpu.Buffer)[0] = math.Float32frombits(uint32(id))
	return heldPick(id), nil
}

func (h heldCPU) EmbedToken(dst backend.Buffer, table backend.Weight, src backend.Buffer) {
	*h.held++
	h.Embed(dst, table, []int32{int32(math.Float32bits(src.(cpu.Buffer)[0]))})
}

// onHeldCPU rebuilds m's network with o on a heldCPU backend, so that m
// generates on the pipelined path without a GPU, and returns the backend.
func onHeldCPU(t testing.TB, m *Model, o model.Options) heldCPU {
	t.Helper()
	hb := heldCPU{cpu.New(1), new(int)}
	net, err := model.Build(hb, m.folder, o)
	if err != nil {
		t.Fatal(err)
	}
	m.backend, m.caps, m.net = hb, backend.CapabilitiesOf(hb), net
	return hb
}

// TestPipelinedGenerateCPU runs checkPipelined on heldCPU, with dense
// attention and with an htree coarse enough to select (so that a cache
// left wrong by a dropped run would show).
func TestPipelinedGenerateCPU(t *testing.T) {
	for _, arch := range []string{"llama", "qwen3"} {
		for _, att := range []model.AttentionOptions{{}, {Kind: "htree", HTree: htree.Options{Rate: 2, TopK: 1, TopCandidates: 2}}} {
			m, err := Load(golden.Path(t, arch), Options{Device: "cpu"})
			if err != nil {
				t.Fatal(err)
			}
			hb := onHeldCPU(t, m, model.Options{Attention: att})
			checkPipelined(t, m, arch)
			if *hb.held < 20 {
				t.Errorf("%s %+v: %d tokens ran ahead", arch, att, *hb.held)
			}
			m.Close()
		}
	}
}

// checkPipelined compares Generate with each pick's run queued before its id
// is read back (the default where the backend keeps picks) against the same
// with that off: the same tokens, and the same session afterwards (its
// tokens, a cache holding exactly them, the tokens a continuation
// generates) after generation stops at a count, at a stop token, at a stream
// error, at cancellation and at the end of the context.
func checkPipelined(t *testing.T, m *Model, arch string) {
	t.Helper()
	ref := golden.Load(t, golden.Path(t, arch))
	checkPipelinedPrompt(t, m, arch, ints(ref.InputIDs[:min(12, len(ref.InputIDs))]))
}

// checkPipelinedPrompt is checkPipelined from prompt.
func checkPipelinedPrompt(t *testing.T, m *Model, arch string, prompt []int) {
	t.Helper()
	if _, ok := m.backend.(backend.TokenPipeliner); !ok {
		t.Fatalf("%s: backend %s keeps no picks", arch, m.backend.Name())
	}
	ctx := context.Background()
	for _, o := range []SamplingOptions{{}, {Temperature: 0.9, TopK: 50, Seed: 3}} {
		var sess [2]*Session
		for i := range sess {
			var err error
			if sess[i], err = m.NewSession(len(prompt) + 40); err != nil {
				t.Fatal(err)
			}
			sess[i].noAhead = i == 1
		}
		// run does the same on the session with and without pipelining.
		// stream, when not nil, is made for each session with a cancel of the
		// context that session's Generate gets.
		run := func(what string, p []int, opts GenerateOptions, stream func(cancel func()) func(Token) error) []int {
			t.Helper()
			var toks [2][]int
			var errs [2]error
			for i, s := range sess {
				ctx, cancel := context.WithCancel(ctx)
				var f func(Token) error
				if stream != nil {
					f = stream(cancel)
				}
				res, err := s.Generate(ctx, p, opts, f)
				cancel()
				if res != nil {
					toks[i] = res.Tokens
				}
				errs[i] = err
				// The cache may lack the last token kept (run by the next call).
				if n := s.st.Len(); n != s.Len() && n != s.Len()-1 {
					t.Errorf("%s %s %+v (ahead %v): the cache holds %d positions, the session %d tokens", arch, what, o, i == 0, n, s.Len())
				}
			}
			if !slices.Equal(toks[0], toks[1]) || (errs[0] == nil) != (errs[1] == nil) || !slices.Equal(sess[0].Tokens(), sess[1].Tokens()) {
				t.Errorf("%s %s %+v: pipelined %v (%v, %d in session), not %v (%v, %d)", arch, what, o,
					toks[0], errs[0], sess[0].Len(), toks[1], errs[1], sess[1].Len())
			}
			return toks[0]
		}
		opts := func(n int, stops ...int) GenerateOptions {
			return GenerateOptions{MaxTokens: n, StopTokens: append([]int{}, stops...), Sampling: o}
		}
		toks := run("max tokens", prompt, opts(6), nil)
		run("continued", nil, opts(5), nil)
		if len(toks) > 2 {
			run("stop token", nil, opts(8, toks[2]), nil)
		}
		run("stream error", nil, opts(8), func(func()) func(Token) error {
			return func(tok Token) error {
				if tok.Index == 2 {
					return errors.New("stop")
				}
				return nil
			}
		})
		run("cancelled", nil, opts(8), func(cancel func()) func(Token) error {
			return func(tok Token) error {
				if tok.Index == 1 {
					cancel()
				}
				return nil
			}
		})
		run("one token", nil, opts(1), nil)
		run("continued", nil, opts(4), nil)
		run("context full", nil, opts(0), nil)
		for i, s := range sess {
			if s.Len() != s.ContextLength() {
				t.Errorf("%s %+v (ahead %v): %d tokens in a context of %d after filling it", arch, o, i == 0, s.Len(), s.ContextLength())
			}
		}
	}
}

// heldMoECPU is heldCPU with DeepSeek-V4's routed experts "on the device"
// (backend.RoutedMoEOps and DeviceHashMoEOps, done on the host), so that a
// V4 model runs a held token's step with no id on the host, as on the GPU:
// the embedding and the hash-routed layers' picks gathered by the held id.
type heldMoECPU struct {
	heldCPU
	hashed *int // RoutedMoEDeviceHash calls
}

type heldExperts struct {
	w1, w3, w2 []backend.Weight
	bias       []float32
}

func (x *heldExperts) NumExperts() int { return len(x.w1) }

func (h heldMoECPU) BindExperts(w1, w3, w2 []backend.Weight, bias []float32) (backend.Experts, error) {
	return &heldExperts{w1, w3, w2, bias}, nil
}

func (h heldMoECPU) MaxDeviceMoETokens() int { return 8 }

// RoutedMoE routes as dsv4.Route and adds each token's experts in expert
// order, each as the model's host path runs it (deepseek_v4.go: moe).
func (h heldMoECPU) RoutedMoE(out, x, logits backend.Buffer, hash []int32, exp backend.Experts, a dsv4.RouteArgs, limit float32) {
	ex := exp.(*heldExperts)
	idx, wts := make([]int32, a.M*a.K), make([]float32, a.M*a.K)
	dsv4.Route(idx, wts, logits.(cpu.Buffer), ex.bias, hash, a)
	ffn, dim := ex.w1[0].Rows(), ex.w1[0].Cols()
	g, u, y := h.NewBuffer(ffn), h.NewBuffer(ffn), h.NewBuffer(dim)
	for i := range a.M {
		picks := slices.Clone(idx[i*a.K : (i+1)*a.K])
		order := make([]int, a.K)
		for j := range order {
			order[j] = j
		}
		slices.SortFunc(order, func(p, q int) int { return int(picks[p] - picks[q]) })
		xi := h.View(x, i*dim, dim)
		for _, j := range order {
			e := picks[j]
			h.MatMul(g, xi, ex.w1[e], 1)
			h.MatMul(u, xi, ex.w3[e], 1)
			h.SwiGLU(g, g, u, limit)
			h.MatMul(y, g, ex.w2[e], 1)
			h.ScatterAddRows(out, y, []int32{int32(i)}, []float32{wts[i*a.K+j]}, dim)
		}
	}
}

func (h heldMoECPU) RoutedMoEDeviceHash(out, x, logits, hash backend.Buffer, exp backend.Experts, a dsv4.RouteArgs, limit float32) {
	*h.hashed++
	ids := make([]int32, a.M*a.K)
	for i, v := range hash.(cpu.Buffer)[:len(ids)] {
		ids[i] = int32(math.Float32bits(v))
	}
	h.RoutedMoE(out, x, logits, ids, exp, a, limit)
}

// TestPipelinedGenerateV4CPU runs checkPipelined on DeepSeek-V4 (whose
// first layer is hash-routed) on heldMoECPU: each held token's step is
// queued with no id on the host (its embedding and hashed picks gathered
// by the held id), and a later replay of the state's tokens (a rewind
// past the last call, which the cancelled and stopped runs make) reads the
// held ids back from the state's record of them.
func TestPipelinedGenerateV4CPU(t *testing.T) {
	m, err := Load(golden.Path(t, "deepseek_v4"), Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	hb := heldMoECPU{heldCPU{cpu.New(1), new(int)}, new(int)}
	net, err := model.Build(hb, m.folder, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.backend, m.caps, m.net = hb, backend.CapabilitiesOf(hb), net
	checkPipelined(t, m, "deepseek_v4")
	if *hb.held < 20 || *hb.hashed < 20 {
		t.Errorf("%d tokens ran ahead, %d hash-routed layers took their picks on the device", *hb.held, *hb.hashed)
	}
	ref := golden.Load(t, golden.Path(t, "deepseek_v4"))
	checkRewound(t, m, ints(ref.InputIDs[:min(12, len(ref.InputIDs))]))
}

// checkRewound generates from prompt with each pick's run queued ahead and
// without, rewinds both sessions past their last call (which empties
// DeepSeek-V4's caches, so that the next call replays every token, those
// run while held included) and generates again: the same tokens.
func checkRewound(t *testing.T, m *Model, prompt []int) {
	t.Helper()
	var got [2][]int
	for i := range got {
		s, err := m.NewSession(len(prompt) + 40)
		if err != nil {
			t.Fatal(err)
		}
		s.noAhead = i == 1
		o := GenerateOptions{MaxTokens: 12, StopTokens: []int{}}
		if _, err := s.Generate(context.Background(), prompt, o, nil); err != nil {
			t.Fatal(err)
		}
		s.Truncate(len(prompt) + 4)
		o.MaxTokens = 6
		res, err := s.Generate(context.Background(), nil, o, nil)
		if err != nil {
			t.Fatal(err)
		}
		got[i] = append(s.Tokens(), res.Tokens...)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("after a rewind, pipelined %v, not %v", got[0], got[1])
	}
}
