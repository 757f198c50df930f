// Package htree holds hierarchical tree attention (htree, docs/htree.md): a
// mean-pooled tree over one layer's keys and values, grown incrementally as
// tokens are appended, and attention that scores coarse nodes, expands only
// the top-K of each level and attends to everything else as it stands.
//
// It has two implementations of the same function: Reference, which builds
// the tree from scratch and materializes every score of every level in
// float64 (the specification), and Attend, the one-pass engine of seed 003
// (online softmax over all candidates, top-K selection, reverse subtraction
// of the selected nodes, merge into a global state) that the CPU backend runs
// and the CUDA kernel must match. Ops is the operation a backend implements.
//
// Keys are stored before RoPE: positions are assigned per query, by a
// node's rank in the candidate list. The package owns the tree layout and the
// attention math only; it reads no checkpoints, knows no model, and holds no
// package-level mutable state.
package htree
