package model

import (
	"context"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
)

// DeepSeek's multi-token prediction (MTP) block, used as the draft model of
// speculative decoding (engine/speculative.go); DeepSeek-V3's is in
// mtp_v3.go. DeepSeek-V4 ships one,
// mtp.0.* (the notes' §5); its math follows MTPBlock of DeepSeek's
// inference/model.py (deepseek-ai/DeepSeek-V4-Flash, the reference
// transformers does not implement, as it drops the block): at position t,
// from the main model's residual streams h_t ([hc_mult, hidden], before
// hc_head) and the token t+1,
//
//	e = e_proj(enorm(embed(token t+1)))
//	x = h_proj(hnorm(h_t)) + e            (hnorm and h_proj per stream, e on every stream)
//	x = Block(x, t)                       (one decoder layer: mHC, sliding-window attention, MoE)
//	logits = head(norm(hc_head'(x)))      (the block's own hc_head_{fn,base,scale} and norm, the shared head)
//
// predicts token t+2. Its attention caches the block's own keys by position
// (compress_ratios[num_hidden_layers] is 0: sliding window only). Drafting
// k tokens runs the block k times, each step feeding the block's output
// streams back as the next position's h (as vLLM's MTP proposer does with
// one block).

// MaxDraft bounds the tokens a Drafter drafts in one call.
const MaxDraft = 8

// Drafter is implemented by models whose MTP block was loaded
// (Options.MTP): they draft the tokens after the next one for speculative
// decoding.
type Drafter interface {
	// CanDraft reports whether the model carries an MTP block and loaded it.
	CanDraft() bool
	// Draft drafts up to k tokens (k <= MaxDraft) after next, the token
	// that follows st's last position and has not run yet: the first from
	// the MTP block at st's last position (with next), each further one
	// from the block's own output. pick chooses each draft token from the
	// block's logits ([vocab]; step 0 is the first). It returns the tokens
	// drafted: fewer than k (none) at the end of the context, or where the
	// residual streams of st's last position are gone (the last call did
	// not run it, as after a rewind that replays). Draft changes no
	// position of st, only the block's own cache.
	Draft(ctx context.Context, st State, next int32, k int, pick func(step int, logits []float32) (int32, error)) ([]int32, error)
}

// mtpRows keeps the main model's residuals (rows of width values) of
// positions [pos0, pos0+rows), which the MTP block has no entries for yet:
// the next Draft catches up over them, whichever forward calls ran them.
type mtpRows struct {
	buf, tmp   backend.Buffer
	pos0, rows int
	capRows    int
	width      int
}

// save keeps the rows x ([n, width]) of positions at.., after the rows
// held from keep on (rows from at on are replaced: a rollback ran them
// again; rows before keep are dropped).
func (r *mtpRows) save(b backend.Backend, x backend.Buffer, at, n, keep int) {
	w := r.width
	if r.rows == 0 || r.pos0 > at || r.pos0+r.rows < at {
		r.pos0, r.rows = at, 0 // nothing contiguous before at is held
	}
	from := min(max(keep, r.pos0), at)
	kept := at - from
	switch {
	case kept+n > r.capRows:
		c := max(kept+n, 2*r.capRows, 16)
		nb := b.NewBuffer(c * w)
		if kept > 0 {
			b.Copy(b.View(nb, 0, kept*w), b.View(r.buf, (from-r.pos0)*w, kept*w))
		}
		r.buf, r.tmp, r.capRows = nb, b.NewBuffer(c*w), c
	case from > r.pos0 && kept > 0: // to the front, through tmp (the views may overlap)
		b.Copy(b.View(r.tmp, 0, kept*w), b.View(r.buf, (from-r.pos0)*w, kept*w))
		b.Copy(b.View(r.buf, 0, kept*w), b.View(r.tmp, 0, kept*w))
	}
	b.Copy(b.View(r.buf, kept*w, n*w), x)
	r.pos0, r.rows = from, kept+n
}

// truncate forgets the rows of positions n on.
func (r *mtpRows) truncate(n int) { r.rows = max(0, min(r.rows, n-r.pos0)) }

// view is the rows of positions [p, p+n), which it must hold.
func (r *mtpRows) view(b backend.Backend, p, n int) backend.Buffer {
	return b.View(r.buf, (p-r.pos0)*r.width, n*r.width)
}

// v4MTP is the MTP block's weights.
type v4MTP struct {
	blk                v4Block
	eProj, hProj       backend.Weight
	enorm, hnorm, norm backend.Buffer
	hcHeadFn           backend.Weight
	hcHeadBase         backend.Buffer
	hcHeadScale        float32
}

// v4MTPState is the block's per-sequence cache: its sliding window (which
// keeps MaxDraft rows more than the window, so that the draft steps can be
// rolled back) and its scratch.
type v4MTPState struct {
	ls       v4LayerState
	pos      int // positions in the window (the last is pos-1)
	exact    int // positions [0, exact) hold entries of the main model's streams (the rest are draft steps)
	base     int // the window's first position (it restarts where the kept streams begin)
	rows     int // scratch rows
	lastRows int // rows of the last step
	keepMax  int // the most window rows kept: sliding_window-1+MaxDraft
	x, hn    backend.Buffer
	e        backend.Buffer
	hl       backend.Buffer
	fin      backend.Buffer
	out      backend.Buffer // [vocab] logits
	host     []float32
	saved    mtpRows // the main model's residual streams from exact (or the window's start) on
}

// truncate keeps the entries of positions [0, p): the window ends there,
// with the rows before it that the buffer still holds (a whole window
// after a rollback of at most MaxDraft rows).
func (ms *v4MTPState) truncate(p int) {
	p = max(p, 0)
	if p >= ms.pos {
		return
	}
	ls := &ms.ls
	end := ls.start + ls.win - (ms.pos - p) // buffer row where position p goes
	if end <= 0 {
		ls.start, ls.win = 0, 0
	} else {
		keep := min(end, ms.keepMax) // rows [0, end) of the buffer are positions [p-end, p)
		ls.start, ls.win = end-keep, keep
	}
	ms.pos = p
	ms.exact = min(ms.exact, p)
}

// loadMTP binds mtp.0.* when the checkpoint holds the block (its
// attn_norm), else returns nil: checkpoints without it (and the released
// layout's stand-in in the tests) load as before.
func (m *DeepseekV4) loadMTP(l *Loader, dims map[string]int) (*v4MTP, error) {
	const prefix = "mtp.0."
	if !l.Has(prefix + "attn_norm.weight") {
		return nil, nil
	}
	cfg, v := m.cfg, m.v
	D, n := cfg.HiddenSize, v.HCMult
	// The released names the attention's KV norm attn.kv_norm (as its
	// layers); a checkpoint may keep transformers' attn.norm.
	outer := l.rename
	ml := *l
	ml.rename = func(s string) string {
		if outer != nil {
			s = outer(s)
		}
		if s == prefix+"attn.norm.weight" && !l.ck.Has(s) {
			return prefix + "attn.kv_norm.weight"
		}
		return s
	}
	mt := &v4MTP{}
	if err := m.loadBlock(&ml, prefix, &mt.blk, v4Sliding, v4MoE, dims); err != nil {
		return nil, fmt.Errorf("model: MTP block: %w", err)
	}
	if err := m.loadRoutedExperts(&ml, prefix, &mt.blk, dims); err != nil {
		return nil, fmt.Errorf("model: MTP block: %w", err)
	}
	var err error
	if mt.eProj, err = ml.Linear(prefix+"e_proj", D, D); err != nil {
		return nil, err
	}
	if mt.hProj, err = ml.Linear(prefix+"h_proj", D, D); err != nil {
		return nil, err
	}
	for _, w := range []struct {
		dst  *backend.Buffer
		name string
	}{{&mt.enorm, "enorm"}, {&mt.hnorm, "hnorm"}, {&mt.norm, "norm"}} {
		if *w.dst, err = ml.Vector(prefix+w.name+".weight", D); err != nil {
			return nil, err
		}
	}
	// hc_head_{fn,base,scale} as released; hc_head.hc_* as transformers
	// names the main model's.
	hcName := func(part string) string {
		if ml.Has(prefix + "hc_head_" + part) {
			return prefix + "hc_head_" + part
		}
		return prefix + "hc_head.hc_" + part
	}
	if mt.hcHeadFn, err = ml.Matrix(hcName("fn"), n, n*D); err != nil {
		return nil, err
	}
	if mt.hcHeadBase, err = ml.Vector(hcName("base"), n); err != nil {
		return nil, err
	}
	sc, err := ml.Float32(hcName("scale"), 1)
	if err != nil {
		return nil, err
	}
	mt.hcHeadScale = sc[0]
	return mt, nil
}

// CanDraft reports whether the MTP block was loaded.
func (m *DeepseekV4) CanDraft() bool { return m.mtp != nil }

// Draft implements Drafter.
func (m *DeepseekV4) Draft(ctx context.Context, st State, next int32, k int, pick func(step int, logits []float32) (int32, error)) ([]int32, error) {
	s, ok := st.(*v4State)
	if !ok || s.m != m {
		return nil, fmt.Errorf("model: state of type %T is not a state of this %s model", st, m.cfg.ModelType)
	}
	if m.mtp == nil {
		return nil, fmt.Errorf("model: %s: no MTP block loaded (the checkpoint lacks mtp.0.*, or Options.MTP is off)", m.cfg.Path)
	}
	if err := checkDraft(k, next, m.cfg.VocabSize); err != nil {
		return nil, err
	}
	s.resolveHeld() // the draft reads the tokens before next
	L := len(s.hist)
	ms := s.mtp
	k, err := draftRoom(ctx, k, L, s.cap, &ms.saved)
	if k <= 0 || err != nil {
		return nil, err
	}
	// Drop the last call's draft steps, and the entry of position L-1 if a
	// call at this length made it (its token may have been another).
	ms.truncate(min(ms.exact, L-1))
	from := ms.exact
	if from < ms.saved.pos0 || from < ms.base || ms.ls.win < min(s.window()-1, from-ms.base) {
		// The streams of positions [from, saved.pos0) are not kept (older
		// than the window), or a rollback cut the window short: it
		// restarts at saved.pos0, from the kept streams. A row's key
		// depends on its input alone (one layer), so this drafts the same
		// where the kept rows cover the window (a rollback past them only
		// makes drafts worse).
		ms.ls.start, ms.ls.win = 0, 0
		from = ms.saved.pos0
		ms.base = from
	}
	b, nh, D := m.b, m.v.HCMult, m.cfg.HiddenSize
	toks := make([]int32, 0, L-from)
	toks = append(toks, s.hist[from+1:L]...)
	toks = append(toks, next)
	hid := ms.saved.view(b, from, len(toks))
	ms.pos = from
	logits, err := m.mtpStep(s, hid, toks)
	if err != nil {
		return nil, err
	}
	ms.exact = L
	return draftLoop(ctx, k, m.cfg.VocabSize, pick, logits, func(d int32) ([]float32, error) {
		// The block's output streams stand in for the main model's at the
		// next position.
		return m.mtpStep(s, b.View(ms.x, (ms.lastRows-1)*nh*D, nh*D), []int32{d})
	})
}

// checkDraft checks a Draft call's k (0 to MaxDraft) and next (in the
// vocabulary [0, vocab)).
func checkDraft(k int, next int32, vocab int) error {
	if k < 0 || k > MaxDraft {
		return fmt.Errorf("model: draft of %d tokens: want 0 to %d", k, MaxDraft)
	}
	if next < 0 || int(next) >= vocab {
		return fmt.Errorf("model: draft after token %d, outside the vocabulary [0, %d)", next, vocab)
	}
	return nil
}

// draftRoom is the number of drafts a call may make after L positions of a
// state of capacity positions: k, fewer where the context ends (room for
// next and the drafts after it), 0 where saved does not end at position L
// (the streams of the last position are gone) or ctx is done (its error).
func draftRoom(ctx context.Context, k, L, capacity int, saved *mtpRows) (int, error) {
	k = min(k, capacity-L-1)
	if k <= 0 || L == 0 || saved.rows == 0 || saved.pos0+saved.rows != L {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return k, nil
}

// draftLoop asks pick for k drafts, the first from logits and each next
// one from the logits next returns for the draft before it (the block run
// over it), checking each is in the vocabulary [0, vocab) and ctx between
// steps. It returns the drafts taken, fewer than k with the error that
// stopped it.
func draftLoop(ctx context.Context, k, vocab int, pick func(step int, logits []float32) (int32, error), logits []float32,
	next func(d int32) ([]float32, error)) ([]int32, error) {
	var drafts []int32
	for step := 0; ; step++ {
		d, err := pick(step, logits)
		if err != nil {
			return drafts, err
		}
		if d < 0 || int(d) >= vocab {
			return drafts, fmt.Errorf("model: draft token %d is outside the vocabulary [0, %d)", d, vocab)
		}
		drafts = append(drafts, d)
		if len(drafts) == k {
			return drafts, nil
		}
		if err := ctx.Err(); err != nil {
			return drafts, err
		}
		if logits, err = next(d); err != nil {
			return drafts, err
		}
	}
}

// mtpStep runs the block at positions ms.pos.. over the streams hid ([n,
// hc_mult*hidden]) and tokens (the token after each position), and returns
// the logits of the last row. Its output streams stay in ms.x.
func (m *DeepseekV4) mtpStep(s *v4State, hid backend.Buffer, tokens []int32) ([]float32, error) {
	b, cfg, v, mt, ms := m.b, m.cfg, m.v, m.mtp, s.mtp
	n, nh, D := len(tokens), v.HCMult, cfg.HiddenSize
	eps := cfg.RMSNormEps
	m.growMTP(s, n)
	if err := m.growState(s, n); err != nil { // the scratch it shares with the main model
		return nil, fmt.Errorf("model: deepseek_v4 MTP: %w", err)
	}
	sc := &s.scratch
	view := func(buf backend.Buffer, width int) backend.Buffer { return b.View(buf, 0, n*width) }

	// Streams in: h_proj(hnorm(h)) + e_proj(enorm(embed)) on every stream.
	hn, x, e := view(ms.hn, nh*D), view(ms.x, nh*D), view(ms.e, D)
	b.RMSNorm(hn, hid, mt.hnorm, eps)
	b.Embed(e, m.embed, tokens)
	b.RMSNorm(e, e, mt.enorm, eps)
	eproj := view(sc.a, D)
	b.MatMul(eproj, e, mt.eProj, n)
	b.MatMul(x, hn, mt.hProj, n*nh)
	m.hc.MHCExpand(hn, eproj, n, nh, D)
	b.Add(x, x, hn)

	// The decoder block.
	blk := &mt.blk
	pos0 := ms.pos
	c := m.hcPre(s, &blk.AttnHC, x, n)
	h := view(sc.h, D)
	b.RMSNorm(h, c, blk.Attn.AttnNorm, eps)
	a := m.attention(s, blk, &ms.ls, h, n, pos0)
	m.hc.MHCPost(x, x, a, view(sc.post, nh), view(sc.res, nh*nh), n, nh, D)
	c = m.hcPre(s, &blk.FFNHC, x, n)
	b.RMSNorm(h, c, blk.Attn.FFNNorm, eps)
	f := m.moe(s, blk, h, tokens, nil)
	m.hc.MHCPost(x, x, f, view(sc.post, nh), view(sc.res, nh*nh), n, nh, D)
	ms.pos += n
	ms.lastRows = n

	// The block's head on the last row.
	xs := b.View(x, (n-1)*nh*D, nh*D)
	m.head(ms.out, ms.hl, ms.fin, xs, mt.hcHeadFn, mt.hcHeadBase, mt.hcHeadScale, mt.norm, 1)
	b.Read(ms.host, ms.out, 0)
	return ms.host, b.Sync()
}

// growMTP makes the block's buffers hold n new rows.
func (m *DeepseekV4) growMTP(s *v4State, n int) {
	ms := s.mtp
	if ms.rows >= n {
		return
	}
	b, cfg, v := m.b, m.cfg, m.v
	nh, D, hd := v.HCMult, cfg.HiddenSize, v.HeadDim
	ls := &ms.ls
	// Window tail with its extra rows, n new rows and as many again as the
	// tail (the slack it moves through).
	rows := 2*(s.window()-1+ls.extra) + n
	ls.growLocal(b, rows, hd, n)
	ms.rows, ms.keepMax = n, s.window()-1+ls.extra
	ms.x = b.NewBuffer(n * nh * D)
	ms.hn = b.NewBuffer(n * nh * D)
	ms.e = b.NewBuffer(n * D)
	if ms.out == nil {
		ms.hl = b.NewBuffer(nh)
		ms.fin = b.NewBuffer(D)
		ms.out = b.NewBuffer(cfg.VocabSize)
		ms.host = make([]float32, cfg.VocabSize)
	}
}

// mtpCacheBytes is the memory of the block's window.
func (ms *v4MTPState) cacheBytes() int64 {
	if ms == nil || ms.ls.local[0] == nil {
		return 0
	}
	return 4 * int64(2*ms.ls.local[0].Len())
}
