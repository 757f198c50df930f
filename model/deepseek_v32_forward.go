package model

import (
	"context"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// MLAPath selects how a DeepSeek-V3.2 state computes attention and what its
// cache holds.
type MLAPath int

const (
	// MLAAuto caches the latent, the rope key and the indexer key of each
	// token; decoding (one token) runs the absorbed path, a prefill whichever
	// of the two paths costs fewer multiply-adds. NewState uses it.
	MLAAuto MLAPath = iota
	// MLAAbsorbed caches as MLAAuto and always runs the absorbed path:
	// attention in the kv_lora latent space with W_UK folded into the query
	// and W_UV applied to the output.
	MLAAbsorbed
	// MLANaive caches what the reference caches: each token's expanded
	// per-head keys and values (k_nope and v from kv_b_proj, and the rope
	// key once), plus the indexer key; attention runs on them.
	MLANaive
	// MLADense skips the indexer and runs dense causal attention over every
	// earlier token through backend.Backend.Attention, with keys [k_nope,
	// k_rope] and values zero-padded to the key width. It exists to test the
	// sparse paths against plain MLA.
	MLADense
)

func (p MLAPath) String() string {
	switch p {
	case MLAAuto:
		return "auto"
	case MLAAbsorbed:
		return "absorbed"
	case MLANaive:
		return "naive"
	case MLADense:
		return "dense"
	}
	return fmt.Sprintf("MLAPath(%d)", int(p))
}

// absorb reports whether the absorbed path is used for n queries over L
// cached tokens on an MLAAuto state: always when decoding one token, else
// when it costs fewer multiply-adds than decompressing all L latents.
func (m *DeepseekV32) absorb(n, L int) bool {
	if n == 1 {
		return true
	}
	a := m.mla
	k := min(m.ixs.TopK, L)
	per := a.NopeDim + a.VDim
	naive := L*a.Heads*per*a.KVLoraRank + n*a.Heads*(a.QKDim()+a.VDim)*k
	absorbed := n*a.Heads*per*a.KVLoraRank + n*a.Heads*(2*a.KVLoraRank+a.RopeDim)*k
	return absorbed <= naive
}

// A long prompt runs in passes of at most chunkMax rows, fewer where the
// context is long: an indexed model's (V3.2's, V4's) lightning indexer
// scores each row of a pass against every cached entry (one per token for
// V3.2, one per rate tokens for V4's compressed layers; the GPU holds a
// pass's [rows, entries] scores and three times as much top-k scratch at
// once), so a pass takes about chunkScoreBudget / entries rows, at least
// chunkMin. No pass materializes a [prompt, prompt/rate] matrix, and the
// scratch a prefill needs beyond its caches stays bounded whatever the
// prompt's length.
const (
	chunkMax         = 512
	chunkMin         = 16
	chunkScoreBudget = 1 << 24 // indexer scores per pass (floats): 64 MiB
)

// indexedChunkRows is the most rows of a pass from position pos0 whose
// indexer scores at most budget floats, its entries one per rate tokens
// (rate 0: no indexer, chunkMax).
func indexedChunkRows(pos0, rate, budget int) int {
	if rate == 0 {
		return chunkMax
	}
	entries := max(1, (pos0+chunkMax)/rate)
	return max(chunkMin, min(chunkMax, budget/entries))
}

// chunkRows is the most rows one forward pass runs from position pos0.
func (m *DeepseekV32) chunkRows(pos0 int) int {
	if m.maxChunk > 0 {
		return m.maxChunk
	}
	rate := 0
	if m.indexer {
		rate = 1
	}
	return indexedChunkRows(pos0, rate, chunkScoreBudget)
}

// Forward runs the decoder over tokens at positions st.Len()..., in passes
// of at most chunkRows rows. On error (cancellation included) the state is
// left as it was.
func (m *DeepseekV32) Forward(ctx context.Context, st State, tokens []int32, all bool) ([]float32, error) {
	if !all {
		logits, err := m.run(ctx, st, tokens, false, nil)
		if err != nil {
			return nil, err
		}
		out, err := hostLogits(m.b, logits, nil)
		if err != nil { // the run appended the tokens: take them back
			st.Truncate(st.Len() - len(tokens))
		}
		return out, err
	}
	out := make([]float32, 0, len(tokens)*m.cfg.VocabSize)
	_, err := m.run(ctx, st, tokens, true, func(logits backend.Buffer) error {
		pass, err := hostLogits(m.b, logits, nil)
		out = append(out, pass...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ForwardDevice runs the decoder over tokens and leaves the last token's
// logits on the backend (valid until the next call with st), so that a
// backend that samples picks the token there: a decode step then reads
// back its token id, not the vocabulary's logits.
func (m *DeepseekV32) ForwardDevice(ctx context.Context, st State, tokens []int32) (backend.Buffer, error) {
	return m.run(ctx, st, tokens, false, nil)
}

// run is Forward up to the logits, which stay on the backend: the last
// pass's (the last token's, or with all each of its rows'), each pass's
// handed to emit (when not nil) before the next pass runs. On error the
// state is left as it was.
func (m *DeepseekV32) run(ctx context.Context, st State, tokens []int32, all bool, emit func(backend.Buffer) error) (backend.Buffer, error) {
	s, ok := st.(*v32State)
	if !ok {
		return nil, fmt.Errorf("model: state of type %T is not a %s state", st, m.cfg.ModelType)
	}
	if err := checkForward(m.cfg, st, tokens); err != nil {
		return nil, err
	}
	start := s.n
	var logits backend.Buffer
	for lo := 0; lo < len(tokens); {
		hi := min(len(tokens), lo+m.chunkRows(s.n))
		var err error
		if logits, err = m.forward(ctx, s, tokens[lo:hi], all, nil); err == nil && emit != nil {
			err = emit(logits)
		}
		if err != nil {
			s.Truncate(start)
			return nil, err
		}
		lo = hi
	}
	return logits, nil
}

// ForwardSampled runs the token whose id src holds on the backend (see
// SampledForwarder) and leaves its logits there, so that the engine queues
// the step before the id has reached the host. With an MTP block, whose
// history needs the id, it waits for the id and runs it as ForwardDevice.
func (m *DeepseekV32) ForwardSampled(ctx context.Context, st State, src backend.Buffer) (backend.Buffer, error) {
	s, ok := st.(*v32State)
	switch {
	case !ok:
		return nil, fmt.Errorf("model: state of type %T is not a %s state", st, m.cfg.ModelType)
	case m.pipe == nil:
		return nil, fmt.Errorf("model: backend %s cannot run a token it holds", m.b.Name())
	case s.mtp != nil:
		var id [1]float32 // the id's int32 bits
		m.b.Read(id[:], src, 0)
		if err := m.b.Sync(); err != nil {
			return nil, err
		}
		return m.run(ctx, st, []int32{int32(math.Float32bits(id[0]))}, false, nil)
	}
	// Token 0 stands for the held one in the checks; EmbedToken reads src.
	if err := checkForward(m.cfg, st, []int32{0}); err != nil {
		return nil, err
	}
	return m.forward(ctx, s, []int32{0}, false, func(x backend.Buffer) { m.pipe.EmbedToken(x, m.Embed, src) })
}

// forward is one pass of run: it returns the pass's logits on the backend.
// embed, when not nil, fills x in place of the gather of tokens' rows.
func (m *DeepseekV32) forward(ctx context.Context, s *v32State, tokens []int32, all bool, embed func(x backend.Buffer)) (backend.Buffer, error) {
	c, b := m.cfg, m.b
	n, pos0, H := len(tokens), s.n, c.HiddenSize
	m.grow(s, n)
	x, h, y := b.View(s.x, 0, n*H), b.View(s.h, 0, n*H), b.View(s.y, 0, n*H)

	if embed != nil {
		embed(x)
	} else {
		b.Embed(x, m.Embed, tokens)
	}
	for l := range m.Blocks {
		if err := ctx.Err(); err != nil {
			s.Truncate(pos0)
			return nil, err
		}
		blk := &m.Blocks[l]
		b.RMSNorm(h, x, blk.AttnNorm, c.RMSNormEps)
		m.attention(s, l, blk, y, h, n, pos0)
		b.Add(x, x, y)
		b.RMSNorm(h, x, blk.MLPNorm, c.RMSNormEps)
		if blk.MoE != nil {
			m.moe(s, blk.MoE, y, h, n)
		} else {
			m.mlp(s, blk.Dense, y, h, n)
		}
		b.Add(x, x, y)
	}
	s.n = pos0 + n
	if s.mtp != nil {
		s.hist = append(s.hist[:pos0], tokens...)
		// From exact-1 (a Truncate may drop the last entry), at most
		// v32MTPRows: a session that does not draft keeps no more.
		s.mtp.saved.save(b, x, pos0, n, max(s.mtp.exact-1, pos0+n-v32MTPRows))
	}
	return m.head.logits(b, c, x, h, s.logits, n, all), nil
}

// attention writes o_proj(MLA(h)) of n tokens at pos0.. into out and
// appends them to layer l's caches.
func (m *DeepseekV32) attention(s *v32State, l int, blk *v32Block, out, h backend.Buffer, n, pos0 int) {
	b, ops, a, ix := m.b, m.ops, m.mla, m.ixs
	r, dr, qk := a.KVLoraRank, a.RopeDim, a.QKDim()
	L := pos0 + n

	// Queries: RMSNorm(q_a_proj(h)) → q_b_proj → RoPE on each head's rope channels.
	cq := b.View(s.cq, 0, n*a.QLoraRank)
	b.MatMul(cq, h, blk.QA, n)
	b.RMSNorm(cq, cq, blk.QANorm, v32LatentEps)
	q := b.View(s.q, 0, n*a.Heads*qk)
	b.MatMul(q, cq, blk.QB, n)
	b.RoPE(q, n, a.Heads, qk, a.NopeDim, pos0, m.rope, false)
	// Keys and values: the normalized latent and the rotated shared rope key.
	lat := b.View(s.lat1, 0, n*r)
	b.MatMul(lat, h, blk.KVALatent, n)
	b.RMSNorm(lat, lat, blk.KVANorm, v32LatentEps)
	kr := b.View(s.kr1, 0, n*dr)
	b.MatMul(kr, h, blk.KVARope, n)
	b.RoPE(kr, n, 1, dr, 0, pos0, m.rope, false)

	att := b.View(s.att, 0, n*a.Heads*a.VDim)
	switch {
	case s.path == MLADense:
		m.denseAttention(s, l, blk, att, q, lat, kr, n, pos0)
		b.MatMul(out, att, blk.O, n)
		return
	case !m.indexer:
		m.v3LatentAttention(s, l, blk, att, q, lat, kr, n, pos0)
		b.MatMul(out, att, blk.O, n)
		return
	}

	// Lightning indexer: keys into the cache, then score and select.
	qI := b.View(s.qI, 0, n*ix.Heads*ix.HeadDim)
	b.MatMul(qI, cq, blk.IQB, n)
	b.RoPE(qI, n, ix.Heads, ix.HeadDim, 0, pos0, m.irope, false)
	kI := b.View(s.ik[l], pos0*ix.HeadDim, n*ix.HeadDim)
	b.MatMul(kI, h, blk.IK, n)
	ops.LayerNorm(kI, kI, blk.IKNormW, blk.IKNormB, v32IndexerEps)
	b.RoPE(kI, n, 1, ix.HeadDim, 0, pos0, m.irope, false)
	wI := b.View(s.wI, 0, n*ix.Heads)
	b.MatMul(wI, h, blk.IW, n)
	// The selection is queued right before the attention that reads it, so
	// that a backend can overlap the two (the GPU stages the attention's
	// queries while the top-k runs).
	selectTokens := func() { ops.IndexerSelect(s.idx, qI, wI, b.View(s.ik[l], 0, L*ix.HeadDim), n, L, pos0) }

	b.Copy(b.View(s.kr[l], pos0*dr, n*dr), kr)
	rope := b.View(s.kr[l], 0, L*dr)
	switch {
	case s.path == MLANaive:
		w := a.Heads * (a.NopeDim + a.VDim)
		b.MatMul(b.View(s.kv[l], pos0*w, n*w), lat, blk.KVB, n)
		selectTokens()
		ops.SparseMLAAttention(att, q, b.View(s.kv[l], 0, L*w), rope, s.idx, n, a, m.scale)
	case s.path == MLAAbsorbed || m.absorb(n, L):
		b.Copy(b.View(s.lat[l], pos0*r, n*r), lat)
		qLat := b.View(s.qLat, 0, n*a.Heads*r)
		ops.MLAAbsorbQuery(qLat, q, blk.KVB, n, a)
		oLat := b.View(s.oLat, 0, n*a.Heads*r)
		selectTokens()
		ops.SparseLatentAttention(oLat, qLat, q, b.View(s.lat[l], 0, L*r), rope, s.idx, n, a, m.scale)
		ops.MLAExpandOutput(att, oLat, blk.KVB, n, a)
	default:
		b.Copy(b.View(s.lat[l], pos0*r, n*r), lat)
		kv := m.kvScratch(s, L)
		b.MatMul(kv, b.View(s.lat[l], 0, L*r), blk.KVB, L)
		selectTokens()
		ops.SparseMLAAttention(att, q, kv, rope, s.idx, n, a, m.scale)
	}
	b.MatMul(out, att, blk.O, n)
}

// denseAttention is plain causal MLA through the backend's attention: keys
// [k_nope, k_rope] per head, values zero-padded to the same width.
func (m *DeepseekV32) denseAttention(s *v32State, l int, blk *v32Block, att, q, lat, kr backend.Buffer, n, pos0 int) {
	b, a := m.b, m.mla
	nd, dr, vd, qk := a.NopeDim, a.RopeDim, a.VDim, a.QKDim()
	per := nd + vd
	kv := m.kvScratch(s, n)
	b.MatMul(kv, lat, blk.KVB, n)
	k, v := b.View(s.dk, 0, n*a.Heads*qk), b.View(s.dv, 0, n*a.Heads*qk)
	for i := range n {
		for h := range a.Heads {
			o := (i*a.Heads + h) * qk
			src := (i*a.Heads + h) * per
			b.Copy(b.View(k, o, nd), b.View(kv, src, nd))
			b.Copy(b.View(k, o+nd, dr), b.View(kr, i*dr, dr))
			b.Copy(b.View(v, o, vd), b.View(kv, src+nd, vd))
		}
	}
	datt := b.View(s.datt, 0, n*a.Heads*qk)
	b.Attention(datt, q, k, v, s.dense, l, pos0, n, layers.AttentionShape{Heads: a.Heads, KVHeads: a.Heads, HeadDim: qk, Scale: m.scale})
	for i := range n {
		for h := range a.Heads {
			b.Copy(b.View(att, (i*a.Heads+h)*vd, vd), b.View(datt, (i*a.Heads+h)*qk, vd))
		}
	}
}

// v3LatentAttention is DeepSeek-V3's MLA over every earlier token in the
// latent space, through Backend.Attention: each query head
// [W_UK^T q_nope, q_rope] against one shared key head [latent, k_rope] a
// token, whose value is the latent (the key itself: its rope channels reach
// only the outputs' rope channels, which are dropped); the heads' latent
// outputs are expanded with W_UV. It computes what the naive attention
// (denseAttention) does, caching KVLoraRank+RopeDim values a token and
// layer instead of Heads*QKDim. q, lat and kr are the pass's rows of s.q,
// s.lat1 and s.kr1, which sit with s.qLat in one buffer (v3Sources): the
// per-head queries and the keys are gathered from it, and the outputs'
// latent channels from the attention's, a few GatherRows launches a pass
// rather than a copy per head and token.
func (m *DeepseekV32) v3LatentAttention(s *v32State, l int, blk *v32Block, att, q, lat, kr backend.Buffer, n, pos0 int) {
	b, a := m.b, m.mla
	r, w := a.KVLoraRank, a.KVLoraRank+a.RopeDim
	qLat := b.View(s.qLat, 0, n*a.Heads*r)
	m.ops.MLAAbsorbQuery(qLat, q, blk.KVB, n, a)
	x := s.v3Gathers(a, n)
	qc, k := b.View(s.dq, 0, n*a.Heads*w), b.View(s.dk, 0, n*w)
	b.GatherRows(qc, s.lsrc, x.q, x.g)
	b.GatherRows(k, s.lsrc, x.k, x.g)
	oc := b.View(s.datt, 0, n*a.Heads*w)
	b.Attention(oc, qc, k, k, s.dense, l, pos0, n, layers.AttentionShape{Heads: a.Heads, KVHeads: 1, HeadDim: w, Scale: m.scale})
	oLat := b.View(s.oLat, 0, n*a.Heads*r)
	b.GatherRows(oLat, oc, x.o, x.g)
	m.ops.MLAExpandOutput(att, oLat, blk.KVB, n, a)
}

// v3Sources returns the offsets, in a buffer of rows rows, of the absorbed
// queries [rows, Heads, KVLoraRank], the queries [rows, Heads, QKDim], the
// latents [rows, KVLoraRank] and the rope keys [rows, RopeDim] that
// v3LatentAttention gathers from, and the buffer's length. Each starts on a
// multiple of 64 values (256 bytes, as a buffer of its own would) and of
// the gathers' row (v3Row).
func v3Sources(a layers.MLAShape, rows int) (qLat, q, lat, kr, end int) {
	g := v3Row(a)
	align := g * 64 / gcd(g, 64)
	up := func(n int) int { return (n + align - 1) / align * align }
	q = up(rows * a.Heads * a.KVLoraRank)
	lat = up(q + rows*a.Heads*a.QKDim())
	kr = up(lat + rows*a.KVLoraRank)
	return 0, q, lat, kr, kr + rows*a.RopeDim
}

// v3Row is the values of a row of v3LatentAttention's gathers: the greatest
// common divisor of the widths and offsets they take (64 for DeepSeek-V3).
func v3Row(a layers.MLAShape) int { return gcd(gcd(a.KVLoraRank, a.RopeDim), a.NopeDim) }

// v3Gather is v3LatentAttention's gathers for a pass of n rows, in rows of
// g values (v3Row): q assembles the queries [n, Heads, KVLoraRank+RopeDim]
// (each head's absorbed query, then its rope channels) and k the keys [n,
// KVLoraRank+RopeDim] (latent, rope key) from the sources (v3Sources of the
// state's rows); o takes the latent channels [n, Heads, KVLoraRank] of the
// attention's outputs [n, Heads, KVLoraRank+RopeDim].
type v3Gather struct {
	n, rows, g int
	q, k, o    []int32
}

// v3Gathers returns s's gathers for a pass of n rows, made again only when
// n or the scratch's rows change.
func (s *v32State) v3Gathers(a layers.MLAShape, n int) *v3Gather {
	x := &s.gather
	if x.g > 0 && x.n == n && x.rows == s.rows {
		return x
	}
	r, dr, qk := a.KVLoraRank, a.RopeDim, a.QKDim()
	g := v3Row(a)
	_, qOff, latOff, krOff, _ := v3Sources(a, s.rows)
	span := func(rows []int32, off, width int) []int32 {
		for j := range width / g {
			rows = append(rows, int32(off/g+j))
		}
		return rows
	}
	x.q, x.k, x.o = x.q[:0], x.k[:0], x.o[:0]
	for i := range n {
		for h := range a.Heads {
			ih := i*a.Heads + h
			x.q = span(span(x.q, ih*r, r), qOff+ih*qk+a.NopeDim, dr)
			x.o = span(x.o, ih*(r+dr), r)
		}
		x.k = span(span(x.k, latOff+i*r, r), krOff+i*dr, dr)
	}
	x.n, x.rows, x.g = n, s.rows, g
	return x
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// mlp writes down(silu(gate h) * up h) of n rows into out.
func (m *DeepseekV32) mlp(s *v32State, f *v32MLP, out, h backend.Buffer, n int) {
	b := m.b
	gate, up := b.View(s.gate, 0, n*f.Width), b.View(s.up, 0, n*f.Width)
	b.MatMul(gate, h, f.Gate, n)
	b.MatMul(up, h, f.Up, n)
	b.SwiGLU(gate, gate, up, 0)
	b.MatMul(out, gate, f.Down, n)
}

// moe writes the mixture of experts of n rows into out: the shared experts
// plus each token's routed experts weighted by the router, routed on the
// device (backend.GroupMoEOps) for short chunks when the backend can, else
// on the host from the router logits.
func (m *DeepseekV32) moe(s *v32State, f *v32MoE, out, h backend.Buffer, n int) {
	b, H := m.b, m.cfg.HiddenSize
	a := f.route
	a.M = n
	if f.Shared != nil {
		m.mlp(s, f.Shared, out, h, n)
	} else {
		b.Scale(out, out, 0)
	}
	if f.dev != nil && n <= m.gmoe.MaxDeviceMoETokens() {
		rl := b.View(s.rl, 0, n*a.Experts)
		b.MatMul(rl, h, f.Router, n)
		m.gmoe.GroupMoE(out, h, rl, f.dev, a)
		return
	}
	logits, idx, w := s.routerLogits(b, f.Router, h, n, a.Experts, a.K)
	layers.GroupRoute(idx, w, logits, f.Bias, a)
	s.runExperts(b, f.Experts, out, h, idx, w, n, a.K, H)
}
