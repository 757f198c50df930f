package model

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
)

// DeepSeek-V3.2's per-sequence state: each layer's latent, rope-key and
// indexer-key caches, the selection block and the activation scratch, grown
// as the sequence does. The forward pass (deepseek_v32_forward.go) reads and
// appends through these.

// v32State is one sequence: per-layer caches and activation scratch.
type v32State struct {
	path   MLAPath
	n, cap int

	lat, kr, ik, kv []backend.Buffer // per layer: latent, rope key, indexer key, expanded k_nope|v
	dense           backend.KVCache
	idx             backend.Indices
	perToken        int64 // cache bytes per position, all layers

	rows                                   int // rows the scratch holds
	x, h, y, cq, q, lat1, kr1, qI, wI, att backend.Buffer
	qLat, oLat, gate, up                   backend.Buffer
	dk, dv, dq, datt, logits               backend.Buffer
	kvTmp                                  backend.Buffer
	kvTmpRows                              int
	lsrc                                   backend.Buffer // DeepSeek-V3's latent path: qLat, q, lat1 and kr1 side by side (v3Sources)
	gather                                 v3Gather       // its gathers, for the last pass's rows
	moeScratch
	mtp  *v32MTPState // nil without an MTP block (mtp_v3.go)
	hist []int32      // the tokens of every position (kept with an MTP block only)
}

func (s *v32State) Len() int { return s.n }
func (s *v32State) Cap() int { return s.cap }
func (s *v32State) Truncate(n int) {
	s.n = min(s.n, max(n, 0))
	if s.dense != nil {
		s.dense.Truncate(s.n)
	}
	if s.mtp != nil {
		s.hist = s.hist[:s.n]
		s.mtp.saved.truncate(s.n)
		s.mtp.truncate(s.n - 1) // the entry of position p pairs it with token p+1
	}
}
func (s *v32State) CacheBytes() int64         { return s.perToken * int64(s.cap) }
func (s *v32State) CacheBytesPerToken() int64 { return s.perToken }

// Path is the MLA path the state runs.
func (s *v32State) Path() MLAPath { return s.path }

// NewState allocates an MLAAuto state for capacity positions. DeepSeek-V3
// (no indexer) then attends in the latent space when the backend has the
// absorption ops (backend.SparseMLAOps), else runs MLADense.
func (m *DeepseekV32) NewState(capacity int) (State, error) {
	if !m.indexer && m.ops == nil {
		return m.NewStateWith(capacity, MLADense)
	}
	return m.NewStateWith(capacity, MLAAuto)
}

// NewStateWith allocates a state for capacity positions that runs the given
// MLA path. DeepSeek-V3's states are MLADense, or (MLAAuto, MLAAbsorbed)
// latent: Backend.Attention of one shared key head [latent, k_rope] per
// token, its value the latent, each query head absorbed into the latent
// space (v3LatentAttention).
func (m *DeepseekV32) NewStateWith(capacity int, path MLAPath) (State, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("model: deepseek_v32 state capacity %d, want > 0", capacity)
	}
	if !m.indexer {
		return m.newV3State(capacity, path)
	}
	b, s := m.b, m.mla
	st := &v32State{path: path, cap: capacity}
	L := m.cacheLayers()
	var width int // float32 values cached per token and layer
	switch path {
	case MLAAuto, MLAAbsorbed, MLANaive:
		idx, err := m.ops.NewIndices(m.ixs)
		if err != nil {
			return nil, err
		}
		st.idx = idx
		st.kr = make([]backend.Buffer, L)
		st.ik = make([]backend.Buffer, L)
		for l := range L {
			st.kr[l] = b.NewBuffer(capacity * s.RopeDim)
			st.ik[l] = b.NewBuffer(capacity * m.ixs.HeadDim)
		}
		width = s.RopeDim + m.ixs.HeadDim
		if path == MLANaive {
			st.kv = make([]backend.Buffer, L)
			for l := range L {
				st.kv[l] = b.NewBuffer(capacity * s.Heads * (s.NopeDim + s.VDim))
			}
			width += s.Heads * (s.NopeDim + s.VDim)
		} else {
			st.lat = make([]backend.Buffer, L)
			for l := range L {
				st.lat[l] = b.NewBuffer(capacity * s.KVLoraRank)
			}
			width += s.KVLoraRank
		}
		st.perToken = int64(L) * int64(width) * 4
	case MLADense:
		cache, err := b.NewKVCache(backend.KVShape{Layers: L, KVHeads: s.Heads, HeadDim: s.QKDim(), Capacity: capacity})
		if err != nil {
			return nil, err
		}
		st.dense = cache
		st.perToken = cache.Bytes() / int64(capacity)
	default:
		return nil, fmt.Errorf("model: unknown MLA path %v", path)
	}
	m.attachMTP(st)
	return st, nil
}

// newV3State allocates a DeepSeek-V3 state: the expanded per-head keys and
// values (MLADense), or one latent key head of KVLoraRank+RopeDim values a
// token and layer, whose value is the latent (MLAAuto, MLAAbsorbed).
func (m *DeepseekV32) newV3State(capacity int, path MLAPath) (State, error) {
	s := m.mla
	shape := backend.KVShape{Layers: m.cacheLayers(), KVHeads: s.Heads, HeadDim: s.QKDim(), Capacity: capacity}
	switch path {
	case MLADense:
	case MLAAuto, MLAAbsorbed:
		if m.ops == nil {
			return nil, fmt.Errorf("model: %s: MLA path %v needs the absorption ops (backend.SparseMLAOps); backend %s lacks them (%v runs without)",
				m.cfg.ModelType, path, m.b.Name(), MLADense)
		}
		path, shape.KVHeads, shape.HeadDim = MLAAbsorbed, 1, s.KVLoraRank+s.RopeDim
	default:
		return nil, fmt.Errorf("model: %s has no indexer: MLA path %v is not available (%v, %v or %v)", m.cfg.ModelType, path, MLAAuto, MLAAbsorbed, MLADense)
	}
	cache, err := m.b.NewKVCache(shape)
	if err != nil {
		return nil, err
	}
	st := &v32State{path: path, cap: capacity, dense: cache, perToken: cache.Bytes() / int64(capacity)}
	m.attachMTP(st)
	return st, nil
}

// grow makes the scratch buffers hold n rows.
func (m *DeepseekV32) grow(s *v32State, n int) {
	if s.rows >= n {
		return
	}
	b, c, a, ix, v := m.b, m.cfg, m.mla, m.ixs, &m.v
	s.rows = n
	s.x = b.NewBuffer(n * c.HiddenSize)
	s.h = b.NewBuffer(n * c.HiddenSize)
	s.y = b.NewBuffer(n * c.HiddenSize)
	s.cq = b.NewBuffer(n * a.QLoraRank)
	if !m.indexer && s.path != MLADense {
		// DeepSeek-V3's latent attention gathers its per-head queries and
		// its keys from these four in one buffer (v3LatentAttention).
		qLat, q, lat, kr, end := v3Sources(a, n)
		s.lsrc = b.NewBuffer(end)
		s.qLat, s.q = b.View(s.lsrc, qLat, q-qLat), b.View(s.lsrc, q, lat-q)
		s.lat1, s.kr1 = b.View(s.lsrc, lat, kr-lat), b.View(s.lsrc, kr, end-kr)
	} else {
		s.q = b.NewBuffer(n * a.Heads * a.QKDim())
		s.lat1 = b.NewBuffer(n * a.KVLoraRank)
		s.kr1 = b.NewBuffer(n * a.RopeDim)
		s.qLat = b.NewBuffer(n * a.Heads * a.KVLoraRank)
	}
	if m.indexer {
		s.qI = b.NewBuffer(n * ix.Heads * ix.HeadDim)
		s.wI = b.NewBuffer(n * ix.Heads)
	}
	s.att = b.NewBuffer(n * a.Heads * a.VDim)
	s.oLat = b.NewBuffer(n * a.Heads * a.KVLoraRank)
	ffn := max(c.IntermediateSize, v.MoEIntermediateSize*max(v.NSharedExperts, 1))
	s.gate = b.NewBuffer(n * ffn)
	s.up = b.NewBuffer(n * ffn)
	s.growMoE(b, n, v.NRoutedExperts, v.MoEIntermediateSize, c.HiddenSize)
	switch {
	case s.path == MLADense:
		s.dk = b.NewBuffer(n * a.Heads * a.QKDim())
		s.dv = b.NewBuffer(n * a.Heads * a.QKDim())
		s.datt = b.NewBuffer(n * a.Heads * a.QKDim())
	case !m.indexer: // latent attention: queries and outputs of Heads heads, keys (the values too) of one
		w := a.KVLoraRank + a.RopeDim
		s.dk = b.NewBuffer(n * w)
		s.dq = b.NewBuffer(n * a.Heads * w)
		s.datt = b.NewBuffer(n * a.Heads * w)
	}
	s.logits = b.NewBuffer(n * c.VocabSize)
}

// kvScratch is a buffer for L tokens of expanded k_nope|v.
func (m *DeepseekV32) kvScratch(s *v32State, L int) backend.Buffer {
	w := m.mla.Heads * (m.mla.NopeDim + m.mla.VDim)
	if s.kvTmpRows < L {
		s.kvTmpRows = max(L, min(2*s.kvTmpRows, s.cap))
		s.kvTmp = m.b.NewBuffer(s.kvTmpRows * w)
	}
	return m.b.View(s.kvTmp, 0, L*w)
}
