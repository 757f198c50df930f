package model

import (
	"context"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
)

// DeepSeek-V3's (and R1's, V3.1's, V3.2's) MTP block is the decoder layer
// model.layers.<num_hidden_layers>.* of the released checkpoints, which
// transformers skips. DeepSeek's inference code does not run it; its
// README and the V3 report (§2.2, eq. 21) define it, and vLLM's
// DeepSeekMultiTokenPredictorLayer (deepseek_mtp.py) runs the released
// weights, which this follows: at position t, from the main model's final
// hidden state h_t (after model.norm) and the token t+1,
//
//	x = eh_proj([enorm(embed(token t+1)); hnorm(h_t)])   (concatenated: embedding first)
//	x = Layer(x, t)                                       (the layer's MLA and MoE, residuals inside)
//	logits = shared_head.head(shared_head.norm(x))
//
// predicts token t+2. Further drafts feed the layer's output x back as the
// next position's h (as vLLM does). The layer's attention caches its keys
// by position in one more layer of the state's cache.

// v32MTPRows bounds the main model's residuals a state keeps for the block
// (positions before them run with h = 0: worse drafts, never other output).
const v32MTPRows = 4096

// v32MTP is the block's weights.
type v32MTP struct {
	blk          v32Block
	enorm, hnorm backend.Buffer
	eh           backend.Weight // eh_proj [hidden, 2*hidden]
	norm         backend.Buffer // shared_head.norm
	head         backend.Weight // shared_head.head (the model's lm_head when absent)
}

// v32MTPState is the block's bookkeeping and scratch in a state.
type v32MTPState struct {
	pos      int // positions in the block's cache
	exact    int // positions [0, exact) hold entries of the main model's hidden states
	rows     int
	lastRows int
	x, h, y  backend.Buffer
	e, cat   backend.Buffer
	hn       backend.Buffer
	out      backend.Buffer
	host     []float32
	saved    mtpRows // the main model's residuals from exact on
}

func (ms *v32MTPState) truncate(p int) {
	p = max(p, 0)
	ms.pos = min(ms.pos, p)
	ms.exact = min(ms.exact, p)
}

// cacheLayers is the layers the state's caches hold: the model's, and the
// MTP block's.
func (m *DeepseekV32) cacheLayers() int {
	if m.mtp != nil {
		return m.cfg.NumLayers + 1
	}
	return m.cfg.NumLayers
}

func (m *DeepseekV32) attachMTP(st *v32State) {
	if m.mtp != nil {
		st.mtp = &v32MTPState{saved: mtpRows{width: m.cfg.HiddenSize}}
	}
}

// loadMTP binds model.layers.<num_hidden_layers>.* when the checkpoint
// holds the block (its enorm), else returns nil.
func (m *DeepseekV32) loadMTP(l *Loader, dims map[string]int) (*v32MTP, error) {
	cfg := m.cfg
	p := fmt.Sprintf("model.layers.%d.", cfg.NumLayers)
	if !l.Has(p + "enorm.weight") {
		return nil, nil
	}
	D := cfg.HiddenSize
	mt := &v32MTP{}
	// The block's MLP is a MoE where the checkpoint has its router (every
	// released one), else dense.
	if err := m.loadBlock(l, p, &mt.blk, l.Has(p+"mlp.gate.weight"), dims); err != nil {
		return nil, fmt.Errorf("model: MTP block: %w", err)
	}
	var err error
	for _, w := range []struct {
		dst  *backend.Buffer
		name string
	}{{&mt.enorm, "enorm.weight"}, {&mt.hnorm, "hnorm.weight"}, {&mt.norm, "shared_head.norm.weight"}} {
		if *w.dst, err = l.Vector(p+w.name, D); err != nil {
			return nil, err
		}
	}
	if mt.eh, err = l.Linear(p+"eh_proj", D, 2*D); err != nil {
		return nil, err
	}
	mt.head = m.LMHead
	if l.Has(p + "shared_head.head.weight") {
		if mt.head, err = l.Linear(p+"shared_head.head", cfg.VocabSize, D); err != nil {
			return nil, err
		}
	}
	return mt, nil
}

// CanDraft reports whether the MTP block was loaded.
func (m *DeepseekV32) CanDraft() bool { return m.mtp != nil }

// Draft implements Drafter.
func (m *DeepseekV32) Draft(ctx context.Context, st State, next int32, k int, pick func(step int, logits []float32) (int32, error)) ([]int32, error) {
	s, ok := st.(*v32State)
	if !ok || s.mtp == nil {
		if !ok {
			return nil, fmt.Errorf("model: state of type %T is not a %s state", st, m.cfg.ModelType)
		}
		return nil, fmt.Errorf("model: %s: no MTP block loaded (the checkpoint lacks model.layers.%d.*, or Options.MTP is off)", m.cfg.Path, m.cfg.NumLayers)
	}
	if err := checkDraft(k, next, m.cfg.VocabSize); err != nil {
		return nil, err
	}
	L := s.n
	ms := s.mtp
	k, err := draftRoom(ctx, k, L, s.cap, &ms.saved)
	if k <= 0 || err != nil {
		return nil, err
	}
	ms.truncate(min(ms.exact, L-1))
	b, D := m.b, m.cfg.HiddenSize
	from := ms.exact
	toks := make([]int32, 0, L-from)
	toks = append(toks, s.hist[from+1:L]...)
	toks = append(toks, next)
	n := len(toks)
	m.growMTP(s, n)
	// h: the main model's final hidden states, model.norm of its residuals.
	// Positions whose residuals are gone (a rollback past the saved rows)
	// run with h = 0: their entries only make the drafts worse.
	hid := b.View(ms.hn, 0, n*D)
	gap := min(max(0, ms.saved.pos0-from), n)
	if gap > 0 {
		b.Scale(b.View(hid, 0, gap*D), b.View(hid, 0, gap*D), 0)
	}
	b.RMSNorm(b.View(hid, gap*D, (n-gap)*D), ms.saved.view(b, from+gap, n-gap), m.Norm, m.cfg.RMSNormEps)
	ms.pos = from
	logits := m.mtpStep(s, hid, toks)
	ms.exact = L
	synced := func(step int, logits []float32) (int32, error) { // mtpStep's logits are valid after a Sync
		if err := b.Sync(); err != nil {
			return 0, err
		}
		return pick(step, logits)
	}
	return draftLoop(ctx, k, m.cfg.VocabSize, synced, logits, func(d int32) ([]float32, error) {
		last := b.View(ms.hn, 0, D)
		b.Copy(last, b.View(ms.x, (ms.lastRows-1)*D, D))
		return m.mtpStep(s, last, []int32{d}), nil
	})
}

// mtpStep runs the block at positions ms.pos.. over the hidden states hid
// ([n, hidden]) and tokens (the token after each position), and returns
// the logits of the last row (valid after a Sync). Its output stays in ms.x.
func (m *DeepseekV32) mtpStep(s *v32State, hid backend.Buffer, tokens []int32) []float32 {
	b, cfg, mt, ms := m.b, m.cfg, m.mtp, s.mtp
	n, D, eps := len(tokens), cfg.HiddenSize, cfg.RMSNormEps
	m.grow(s, n) // the scratch it shares with the main model
	view := func(buf backend.Buffer, width int) backend.Buffer { return b.View(buf, 0, n*width) }
	e, x, h, y, cat := view(ms.e, D), view(ms.x, D), view(ms.h, D), view(ms.y, D), view(ms.cat, 2*D)
	b.Embed(e, m.Embed, tokens)
	b.RMSNorm(e, e, mt.enorm, eps)
	b.RMSNorm(h, hid, mt.hnorm, eps)
	for i := 0; i < n; i++ { // [enorm(e); hnorm(h)] a row
		b.Copy(b.View(cat, 2*i*D, D), b.View(e, i*D, D))
		b.Copy(b.View(cat, (2*i+1)*D, D), b.View(h, i*D, D))
	}
	b.MatMul(x, cat, mt.eh, n)

	blk, pos0 := &mt.blk, ms.pos
	b.RMSNorm(h, x, blk.AttnNorm, eps)
	m.attention(s, cfg.NumLayers, blk, y, h, n, pos0)
	b.Add(x, x, y)
	b.RMSNorm(h, x, blk.MLPNorm, eps)
	if blk.MoE != nil {
		m.moe(s, blk.MoE, y, h, n)
	} else {
		m.mlp(s, blk.Dense, y, h, n)
	}
	b.Add(x, x, y)
	ms.pos += n
	ms.lastRows = n

	last := b.View(h, (n-1)*D, D)
	b.RMSNorm(last, b.View(x, (n-1)*D, D), mt.norm, eps)
	b.MatMul(ms.out, last, mt.head, 1)
	b.Read(ms.host, ms.out, 0)
	return ms.host
}

// growMTP makes the block's scratch hold n rows.
func (m *DeepseekV32) growMTP(s *v32State, n int) {
	ms := s.mtp
	if ms.rows >= n {
		return
	}
	b, D := m.b, m.cfg.HiddenSize
	ms.rows = n
	ms.x, ms.h, ms.y, ms.e, ms.hn = b.NewBuffer(n*D), b.NewBuffer(n*D), b.NewBuffer(n*D), b.NewBuffer(n*D), b.NewBuffer(n*D)
	ms.cat = b.NewBuffer(2 * n * D)
	if ms.out == nil {
		ms.out = b.NewBuffer(m.cfg.VocabSize)
		ms.host = make([]float32, m.cfg.VocabSize)
	}
}
