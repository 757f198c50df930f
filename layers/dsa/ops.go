package dsa

import (
	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// Indices is a block of selected key indices on a backend's device (on the
// CPU, a Selection), made by Ops.DSANewIndices and filled by Ops.DSASelect.
// It belongs to one sequence's state: it is not safe for concurrent use.
type Indices interface {
	// Rows is the number of queries the last DSASelect filled.
	Rows() int
}

// Ops is what a backend implements to run DeepSeek Sparse Attention and the
// MLA steps that backend.Backend lacks, at whole-call granularity (every
// token of a chunk, every head, in one call). Each method computes what the
// function named in its comment computes, on device buffers.
type Ops interface {
	// DSALayerNorm is layers.LayerNorm: rows of len(w) values of x into dst
	// (dst may be x), with bias b.
	DSALayerNorm(dst, x, w, b backend.Buffer, eps float32)
	// DSANewIndices allocates a selection block for queries of an indexer
	// of shape s.
	DSANewIndices(s IndexerShape) (Indices, error)
	// DSASelect is Indexer.Select for m queries at positions pos0..pos0+m-1
	// of one sequence: q [m, Heads, HeadDim] (RoPE applied), w [m, Heads]
	// (weights_proj output, before PrepareWeights: it is scaled in place), keys [nKeys, HeadDim] (PrepareKeys applied). Query i sees keys
	// [0, pos0+i+1).
	DSASelect(idx Indices, q, w, keys backend.Buffer, m, nKeys, pos0 int)
	// DSAAttendMLA is AttendMLA for each of m queries over its selected
	// tokens: q [m, Heads, QKDim], kv [*, Heads, NopeDim+VDim], kRope [*,
	// RopeDim] into out [m, Heads, VDim].
	DSAAttendMLA(out, q, kv, kRope backend.Buffer, idx Indices, m int, s layers.MLAShape, scale float32)
	// DSAAttendLatent is AttendLatent for each of m queries over its
	// selected tokens: qLat [m, Heads, KVLoraRank], the rope channels of q
	// [m, Heads, QKDim], latent [*, KVLoraRank], kRope [*, RopeDim] into out
	// [m, Heads, KVLoraRank].
	DSAAttendLatent(out, qLat, q, latent, kRope backend.Buffer, idx Indices, m int, s layers.MLAShape, scale float32)
	// MLAAbsorbQuery is layers.MLAAbsorbQuery for m tokens: the nope
	// channels of q [m, Heads, QKDim] into qLat [m, Heads, KVLoraRank], with
	// W_UK read from kvB (kv_b_proj, [Heads*(NopeDim+VDim), KVLoraRank]).
	MLAAbsorbQuery(qLat, q backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape)
	// MLAExpandOutput is layers.MLAExpandOutput for m tokens: outLat [m,
	// Heads, KVLoraRank] into out [m, Heads, VDim] with W_UV from kvB.
	MLAExpandOutput(out, outLat backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape)
	// DSAGather copies rows[i] of src ([*, w]) to row i of dst (MoE dispatch).
	DSAGather(dst, src backend.Buffer, rows []int32, w int)
	// DSAScatterAdd adds scale[i] * row i of src to row rows[i] of dst ([*,
	// w]) (MoE combine).
	DSAScatterAdd(dst, src backend.Buffer, rows []int32, scale []float32, w int)
}
