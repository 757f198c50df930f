// Package dsa holds the CPU reference math of DeepSeek Sparse Attention
// (DSA), the attention of DeepSeek-V3.2: the lightning indexer that scores
// every cached token for every query, the top-k selection of the tokens each
// query attends to (ties broken exactly as torch.topk breaks them), sparse
// attention over only the selected tokens (both on expanded per-head keys and
// values and on the compressed MLA latent), and the indexer-key cache used
// while decoding.
//
// Everything here is plain Go over []float32 in row-major layouts stated on
// each function; the functions are the specification a GPU kernel must
// reproduce and the fallback when none is available. The indexer scores any
// key set (the tokens of a sequence, or compressed entries such as
// DeepSeek-V4's), so callers decide which keys exist and which are visible.
//
// The package owns no model code: it reads no checkpoints, knows no tensor
// names and does not depend on a compute backend. It holds no package-level
// mutable state.
package dsa
