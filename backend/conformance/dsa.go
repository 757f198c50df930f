package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
)

// dsaCases are DeepSeek Sparse Attention: the lightning indexer's scores
// and top-k (SparseMLAOps.IndexerSelect) of m queries, the last at position
// nKeys-1, then the MLA attention over the selected keys in both forms
// (SparseMLAAttention over expanded keys and values; SparseLatentAttention
// in the latent space) with that selection, against layers/dsa's Select,
// AttendMLA and AttendLatent. On the CUDA backend the indexer's scores take
// idx_scores_mma (at most 64 heads, dims a multiple of 8 up to 128),
// idx_scores_tile (dims a multiple of 4 past that) or idx_scores (other
// dims); the expanded attention dsa_attend; the latent one dsa_attend_mma16
// (rank a multiple of 128, rank + rope <= 576), dsa_attend_mma (rank a
// multiple of 64), dsa_attend_split (rank a multiple of 4) with
// dsa_attend_combine where the selection is split over blocks, or
// dsa_attend (other ranks).
func dsaCases() []Case {
	return rows([]dsaRow{
		{1, 300, dsa.IndexerShape{Heads: 8, HeadDim: 32, RopeDim: 16, TopK: 200}, 512, 64, 4}, // idx_scores_mma, dsa_attend_mma16 (+combine)
		{3, 77, dsa.IndexerShape{Heads: 5, HeadDim: 64, RopeDim: 16, TopK: 16}, 192, 16, 3},   // idx_scores_mma, dsa_attend_mma
		{4, 150, dsa.IndexerShape{Heads: 6, HeadDim: 36, RopeDim: 16, TopK: 40}, 200, 16, 18}, // idx_scores_tile, dsa_attend_split (heads off 16)
		{2, 90, dsa.IndexerShape{Heads: 3, HeadDim: 30, RopeDim: 10, TopK: 100}, 130, 6, 2},   // idx_scores, dsa_attend (latent)
		{5, 260, dsa.IndexerShape{Heads: 72, HeadDim: 32, RopeDim: 16, TopK: 64}, 256, 32, 4}, // 72 heads: idx_scores_tile
	}, dsaCase)
}

// dsaRow is m queries over nKeys keys, the indexer of shape ix, and MLA of
// hds heads at KV LoRA rank rank and RoPE width rope.
type dsaRow struct {
	m, nKeys        int
	ix              dsa.IndexerShape
	rank, rope, hds int
}

func dsaCase(s dsaRow) Case {
	shape := fmt.Sprintf("m=%d/keys=%d/idx-h=%d/idx-d=%d/k=%d/rank=%d/rope=%d/h=%d", s.m, s.nKeys, s.ix.Heads, s.ix.HeadDim, s.ix.TopK, s.rank, s.rope, s.hds)
	return Case{Op: "SparseMLAOps.IndexerSelect,SparseMLAAttention,SparseLatentAttention", Shape: shape, Tol: 2e-5, Needs: "SparseMLAOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			return dsaAttend(b, caps, rng, s.ix, s.m, s.nKeys, layers.MLAShape{Heads: s.hds, KVLoraRank: s.rank, NopeDim: 24, RopeDim: s.rope, VDim: 20})
		}}
}

func dsaAttend(b backend.Backend, caps backend.Capabilities, rng *rand.Rand, ix dsa.IndexerShape, m, L int, ms layers.MLAShape) ([]float32, []float32) {
	pos0 := L - m
	iq, iw, ik := rnd(rng, m*ix.Heads*ix.HeadDim, 1), rnd(rng, m*ix.Heads, 1), rnd(rng, L*ix.HeadDim, 1)
	ref := must(dsa.NewIndexer(ix, 1))
	wp := append([]float32(nil), iw...)
	dsa.PrepareWeights(wp, ix)
	var sel dsa.Selection
	ref.Select(&sel, iq, wp, ik, m, L, func(i int) int { return pos0 + i + 1 })

	H, r, rd, nd, vd, qk := ms.Heads, ms.KVLoraRank, ms.RopeDim, ms.NopeDim, ms.VDim, ms.QKDim()
	per := nd + vd
	q, kv, kr := rnd(rng, m*H*qk, 1), rnd(rng, L*H*per, 1), rnd(rng, L*rd, 1)
	qLat, lat := rnd(rng, m*H*r, 1), rnd(rng, L*r, 1)
	scale := float32(1 / math.Sqrt(float64(qk)))
	latScale := float32(1 / math.Sqrt(float64(r+rd)))
	wantMLA, wantLat := make([]float32, m*H*vd), make([]float32, m*H*r)
	p := make([]float32, H*L)
	qRope := make([]float32, H*rd)
	for i := range m {
		idx := sel.Row(i)
		dsa.AttendMLA(wantMLA[i*H*vd:(i+1)*H*vd], q[i*H*qk:(i+1)*H*qk], kv, kr, idx, ms, scale, p)
		for h := range H {
			copy(qRope[h*rd:(h+1)*rd], q[(i*H+h)*qk+nd:(i*H+h+1)*qk])
		}
		dsa.AttendLatent(wantLat[i*H*r:(i+1)*H*r], qLat[i*H*r:(i+1)*H*r], qRope, lat, kr, idx, H, r, rd, r, rd, latScale, p)
	}

	ops := caps.SparseMLA
	gi := must(ops.NewIndices(ix))
	ops.IndexerSelect(gi, upload(b, iq), upload(b, iw), upload(b, ik), m, L, pos0)
	qb, krb := upload(b, q), upload(b, kr)
	om, ol := b.NewBuffer(len(wantMLA)), b.NewBuffer(len(wantLat))
	ops.SparseMLAAttention(om, qb, upload(b, kv), krb, gi, m, ms, scale)
	ops.SparseLatentAttention(ol, upload(b, qLat), qb, upload(b, lat), krb, gi, m, ms, latScale)
	return append(read(b, om), read(b, ol)...), append(wantMLA, wantLat...)
}
