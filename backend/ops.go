package backend

import (
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// This file declares the ops beyond Backend's core that some architectures
// need, each group an interface a backend implements whole. Every method
// computes what the reference function named in its comment computes (in
// layers/...), on device buffers, at whole-call granularity (every token of
// a chunk, every head). A model asks for the groups it needs once, at load
// (Capabilities), and fails there with an error naming the group when the
// backend lacks one.

// Indices is a block of selected key indices on a backend's device (on the
// CPU, a dsa.Selection), made by SparseMLAOps.NewIndices and filled by
// IndexerSelect. It belongs to one sequence's state: it is not safe for
// concurrent use.
type Indices interface {
	// Rows is the number of queries the last IndexerSelect filled.
	Rows() int
}

// SparseMLAOps runs multi-head latent attention over the keys a lightning
// indexer selects (DeepSeek Sparse Attention, layers/dsa and layers/mla.go).
type SparseMLAOps interface {
	// LayerNorm is layers.LayerNorm: rows of len(w) values of x into dst
	// (dst may be x), with bias b.
	LayerNorm(dst, x, w, b Buffer, eps float32)
	// NewIndices allocates a selection block for queries of an indexer of
	// shape s.
	NewIndices(s dsa.IndexerShape) (Indices, error)
	// IndexerSelect is dsa.Indexer.Select for m queries at positions
	// pos0..pos0+m-1 of one sequence: q [m, Heads, HeadDim] (RoPE applied),
	// w [m, Heads] (weights_proj output, before PrepareWeights: it is scaled
	// in place), keys [nKeys, HeadDim] (PrepareKeys applied). Query i sees
	// keys [0, pos0+i+1).
	IndexerSelect(idx Indices, q, w, keys Buffer, m, nKeys, pos0 int)
	// SparseMLAAttention is dsa.AttendMLA for each of m queries over its
	// selected tokens: q [m, Heads, QKDim], kv [*, Heads, NopeDim+VDim],
	// kRope [*, RopeDim] into out [m, Heads, VDim].
	SparseMLAAttention(out, q, kv, kRope Buffer, idx Indices, m int, s layers.MLAShape, scale float32)
	// SparseLatentAttention is dsa.AttendLatent for each of m queries over
	// its selected tokens: qLat [m, Heads, KVLoraRank], the rope channels of
	// q [m, Heads, QKDim], latent [*, KVLoraRank], kRope [*, RopeDim] into
	// out [m, Heads, KVLoraRank].
	SparseLatentAttention(out, qLat, q, latent, kRope Buffer, idx Indices, m int, s layers.MLAShape, scale float32)
	// MLAAbsorbQuery is layers.MLAAbsorbQuery for m tokens: the nope
	// channels of q [m, Heads, QKDim] into qLat [m, Heads, KVLoraRank], with
	// W_UK read from kvB (kv_b_proj, [Heads*(NopeDim+VDim), KVLoraRank]).
	MLAAbsorbQuery(qLat, q Buffer, kvB Weight, m int, s layers.MLAShape)
	// MLAExpandOutput is layers.MLAExpandOutput for m tokens: outLat [m,
	// Heads, KVLoraRank] into out [m, Heads, VDim] with W_UV from kvB.
	MLAExpandOutput(out, outLat Buffer, kvB Weight, m int, s layers.MLAShape)
}

// CompressedAttentionOps runs attention over a sliding window plus
// compressed KV entries picked by an indexer (DeepSeek-V4, layers/dsv4).
type CompressedAttentionOps interface {
	// CompressKV is dsv4.Compress: kv and gate [SourceRows, RowWidth], ape
	// [Rate, RowWidth], norm [Width] into dst [Entries, Width].
	CompressKV(dst, kv, gate, ape, norm Buffer, a dsv4.CompressArgs)
	// CompressedIndexTopK is dsv4.IndexTopK: q [M, Heads, Dim], keys
	// [Entries, Dim], weights [M, Heads] into idx [M, TopK] (float-coded
	// indices, -1 padded).
	CompressedIndexTopK(idx, q, keys, weights Buffer, a dsv4.IndexArgs)
	// CompressedAttention is dsv4.Attention: q [M, Heads, Dim], local
	// [Pos0+M-Lo, Dim], comp [Entries, Dim], idx [M, TopK] or nil, sinks
	// [Heads] into out.
	CompressedAttention(out, q, local, comp, idx, sinks Buffer, a dsv4.AttnArgs)
	// Transpose is dsv4.Transpose: src [a, b, w] into dst [b, a, w].
	Transpose(dst, src Buffer, a, b, w int)
	// GroupedMatMul is the grouped output projection: x [m, len(ws), cols]
	// (the groups of each row) into dst [m, len(ws), rows], group j times
	// ws[j]ᵀ; every weight is [rows, cols].
	GroupedMatMul(dst, x Buffer, ws []Weight, m int)
}

// HyperConnectionOps runs manifold-constrained hyper-connections (layers/mhc),
// one method per step of the fused-kernel split. Rows are tokens; every call
// covers all of them.
type HyperConnectionOps interface {
	// MHCProject is mhc.Project: logits [rows, fn.Rows()] from x [rows,
	// fn.Cols()] and fn (hc_*_fn or hc_head.hc_fn, [mix, n*C]).
	MHCProject(logits, x Buffer, fn Weight, rows int, normEps float32)
	// MHCActivate is mhc.Mixer.Activate: logits [rows, MixDim]
	// (overwritten), base [MixDim] and scale [3] into pre, post [rows, n]
	// and res [rows, n, n].
	MHCActivate(m *mhc.Mixer, pre, post, res, logits, base, scale Buffer, rows int)
	// MHCPre is mhc.Pre: dst [rows, C] = sum_i pre[rows, i] * x[rows, i, C].
	MHCPre(dst, x, pre Buffer, rows, n, hidden int)
	// MHCPost is mhc.Post: dst [rows, n, C] from x [rows, n, C], out [rows,
	// C], post [rows, n] and res [rows, n, n]; dst may be x.
	MHCPost(dst, x, out, post, res Buffer, rows, n, hidden int)
	// MHCHeadActivate is mhc.HeadActivate: hc_head logits [rows, n] into
	// collapse weights in place, base [n].
	MHCHeadActivate(pre, base Buffer, scale, eps float32, rows, n int)
	// MHCExpand is mhc.Expand: dst [rows, n, C] holds n copies of emb
	// [rows, C].
	MHCExpand(dst, emb Buffer, rows, n, hidden int)
}

// FusedHyperConnectionOps is optional: a backend that implements it runs a
// site's coefficients and its Pre in one call (seed 000's fused kernels).
type FusedHyperConnectionOps interface {
	// MHCCoeffsPre is MHCProject (with m's NormEps), MHCActivate and MHCPre
	// in one: from x [rows, n, C] and the site's fn, base and scale it
	// writes logits [rows, MixDim] (as MHCActivate leaves them), pre and
	// post [rows, n], res [rows, n, n] and dst [rows, C].
	MHCCoeffsPre(m *mhc.Mixer, dst, pre, post, res, logits, x Buffer, fn Weight, base, scale Buffer, rows int)
}

// TreeCache holds one sequence's htree trees on a backend's device. Its
// methods mean what KVCache's mean.
type TreeCache interface {
	KVCache
}

// TreeAttentionOps runs htree hierarchical sparse attention
// (layers/dsa/htree).
type TreeAttentionOps interface {
	// NewTreeCache allocates empty trees (and the RoPE table) for s.
	NewTreeCache(s htree.CacheShape) (TreeCache, error)
	// TreeAttention appends k and v ([m, KVHeads, HeadDim], k before RoPE)
	// to layer's tree at positions pos0.., then writes into out ([m, Heads,
	// HeadDim]) htree.Attend of every query head of q ([m, Heads, HeadDim],
	// before RoPE) at positions pos0..pos0+m-1.
	TreeAttention(out, q, k, v Buffer, c TreeCache, layer, pos0, m int, s layers.AttentionShape)
}

// RoutedMoEOps routes a DeepSeek-V4 MoE block (top-k or hash routing) and
// runs its routed experts on the device, with no host round trip a layer.
// Optional: without it the model routes on the host (dsv4.Route) and runs a
// MatMul per picked expert.
type RoutedMoEOps interface {
	ExpertBinder
	// RoutedMoE routes the a.M tokens of logits ([M, Experts]) as dsv4.Route
	// does (hash: [M, K] expert ids, or nil; the bias given to BindExperts)
	// and adds each token's routed experts to out ([M, hidden]): out[i] +=
	// sum_j w_ij W2_j SwiGLU(W1_j x_i, W3_j x_i, limit), the experts added
	// in expert order.
	RoutedMoE(out, x, logits Buffer, hash []int32, ex Experts, a dsv4.RouteArgs, limit float32)
}

// DeviceHashMoEOps is implemented by RoutedMoEOps backends that also take
// a hash-routed layer's expert ids from the device, where the run of a
// token held there (TokenPipeliner) finds them: gathered from the layer's
// tid2eid table by the held id (TokenPipeliner.EmbedToken of a table of
// ids), so that no id crosses to the host mid-step.
type DeviceHashMoEOps interface {
	RoutedMoEOps
	// RoutedMoEDeviceHash is RoutedMoE with the hashed picks in hash, a
	// buffer of [M, K] expert ids, each an int32 in a float32's bits.
	RoutedMoEDeviceHash(out, x, logits, hash Buffer, ex Experts, a dsv4.RouteArgs, limit float32)
}

// PagedShape sizes a block pool: Blocks blocks of BlockSize positions, each
// position KVHeads*HeadDim keys and as many values, for each of Layers
// layers.
type PagedShape struct {
	Layers, KVHeads, HeadDim int
	BlockSize, Blocks        int
}

// BlockPool is a paged KV cache on a backend's device: fixed-size blocks of
// key and value rows per layer, shared by the sequences of a model through
// block tables (layers.PagedSeq). Which sequence owns which block is the
// caller's (a block allocator's): the pool only stores rows.
type BlockPool interface {
	Shape() PagedShape
	// Bytes is the device memory the pool holds.
	Bytes() int64
}

// PagedAttentionOps runs attention over a paged KV cache (layers/paged.go):
// sequences of different lengths in one call, each reading its keys through
// its own block table, so that sequences sharing a prompt prefix share its
// blocks.
type PagedAttentionOps interface {
	// NewBlockPool allocates a pool of s.Blocks blocks.
	NewBlockPool(s PagedShape) (BlockPool, error)
	// PagedAppend is layers.PagedWrite of k and v ([m, KVHeads, HeadDim])
	// into layer's key and value blocks at positions pos0..pos0+m-1 of the
	// sequence whose block table is table.
	PagedAppend(p BlockPool, layer int, k, v Buffer, table []int32, pos0, m int)
	// PagedAppendRoPE is, for each sequence of seqs in turn (its rows of q
	// [sum Rows, heads, HeadDim], k and v as PagedAttention takes them),
	// Backend.RoPE by r (nil: none) of its q rows and its k rows at
	// positions Pos0.. (stride HeadDim, offset 0, forward) and then
	// PagedAppend of its k and v rows: a batched step's rotations and
	// appends in one call. Where a PagedAttention of q over the same rows
	// follows, the backend may do both in that call, leaving q and k
	// unrotated in memory (as Backend.Attention takes in a RoPE of q and k
	// queued just before it): callers read them only through it.
	PagedAppendRoPE(p BlockPool, layer int, q, k, v Buffer, seqs []layers.PagedSeq, heads int, r *layers.RoPE)
	// PagedAttention is layers.PagedAttention: q [sum Rows, Heads, HeadDim]
	// (the rows of seqs[0], then seqs[1], ...) into out of the same shape,
	// row i of a sequence at position Pos0+i seeing its keys [0, Pos0+i]
	// (within s.Window) of layer, already appended.
	PagedAttention(out, q Buffer, p BlockPool, layer int, seqs []layers.PagedSeq, s layers.AttentionShape)
	// CopyBlock copies block src to block dst in every layer (copy-on-write
	// of a shared block).
	CopyBlock(p BlockPool, dst, src int)
}

// Capabilities holds the optional op groups a backend implements, asked
// once (CapabilitiesOf) and kept by whoever runs on the backend. A nil
// field is a group the backend lacks.
type Capabilities struct {
	Sampler         TokenSampler
	BatchSampler    BatchTokenSampler
	Pipeliner       TokenPipeliner
	SparseMLA       SparseMLAOps
	Compressed      CompressedAttentionOps
	HyperConnection HyperConnectionOps
	FusedHyper      FusedHyperConnectionOps
	TreeAttention   TreeAttentionOps
	RoutedMoE       RoutedMoEOps
	DeviceHashMoE   DeviceHashMoEOps
	GroupMoE        GroupMoEOps
	SoftmaxMoE      SoftmaxMoEOps
	Paged           PagedAttentionOps
	Memory          MemoryReporter
}

// MemoryReporter is implemented by backends whose allocations end the
// process instead of failing when memory runs out (the CPU), so that caches
// are sized against what they report first.
type MemoryReporter interface {
	// MemoryBytes is the memory the backend's buffers may take (<= 0: unknown).
	MemoryBytes() int64
}

// CapabilitiesOf asks b for each optional op group.
func CapabilitiesOf(b Backend) Capabilities {
	var c Capabilities
	c.Sampler, _ = b.(TokenSampler)
	c.BatchSampler, _ = b.(BatchTokenSampler)
	c.Pipeliner, _ = b.(TokenPipeliner)
	c.SparseMLA, _ = b.(SparseMLAOps)
	c.Compressed, _ = b.(CompressedAttentionOps)
	c.HyperConnection, _ = b.(HyperConnectionOps)
	c.FusedHyper, _ = b.(FusedHyperConnectionOps)
	c.TreeAttention, _ = b.(TreeAttentionOps)
	c.RoutedMoE, _ = b.(RoutedMoEOps)
	c.DeviceHashMoE, _ = b.(DeviceHashMoEOps)
	c.GroupMoE, _ = b.(GroupMoEOps)
	c.SoftmaxMoE, _ = b.(SoftmaxMoEOps)
	c.Paged, _ = b.(PagedAttentionOps)
	c.Memory, _ = b.(MemoryReporter)
	return c
}
