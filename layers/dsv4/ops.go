package dsv4

import "github.com/manifoldlm/manifold/backend"

// Ops is what a backend implements to run DeepSeek-V4's own operations on its
// device, at whole-call granularity (every token of a chunk in one call).
// Each method computes what the function of the same name in this package
// computes, on device buffers; index lists that the host decides (MoE
// dispatch) are host slices.
type Ops interface {
	// V4Compress is Compress: kv and gate [SourceRows, RowWidth], ape
	// [Rate, RowWidth], norm [Width] into dst [Entries, Width].
	V4Compress(dst, kv, gate, ape, norm backend.Buffer, a CompressArgs)
	// V4IndexTopK is IndexTopK: q [M, Heads, Dim], keys [Entries, Dim],
	// weights [M, Heads] into idx [M, TopK] (float-coded indices, -1 padded).
	V4IndexTopK(idx, q, keys, weights backend.Buffer, a IndexArgs)
	// V4Attention is Attention: q [M, Heads, Dim], local [Pos0+M-Lo, Dim],
	// comp [Entries, Dim], idx [M, TopK] or nil, sinks [Heads] into out.
	V4Attention(out, q, local, comp, idx, sinks backend.Buffer, a AttnArgs)
	// V4Transpose is Transpose: src [a, b, w] into dst [b, a, w].
	V4Transpose(dst, src backend.Buffer, a, b, w int)
	// V4Gather is Gather: rows of src ([*, w]) into dst [len(rows), w].
	V4Gather(dst, src backend.Buffer, rows []int32, w int)
	// V4ScatterAdd is ScatterAdd: dst[rows[i]] += scale[i] * src[i].
	V4ScatterAdd(dst, src backend.Buffer, rows []int32, scale []float32, w int)
}

// MoEOps is implemented by backends that route a DeepSeek-V4 MoE block and
// run its routed experts on their device, with no host round trip per
// layer. It is optional: without it the model routes on the host (Route)
// and runs a MatMul per picked expert.
type MoEOps interface {
	backend.ExpertBinder
	// MoE routes the a.M tokens of logits ([M, Experts]) as Route does (hash:
	// [M, K] expert ids, or nil; the bias given to BindExperts) and adds each
	// token's routed experts to out ([M, hidden]): out[i] += sum_j w_ij W2_j
	// SwiGLU(W1_j x_i, W3_j x_i, limit), the experts added in expert order.
	MoE(out, x, logits backend.Buffer, hash []int32, ex backend.Experts, a RouteArgs, limit float32)
}
