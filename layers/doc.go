// Package layers holds the reference math of the transformer building blocks that
// every architecture shares: RMS and layer norms, rotary position embeddings,
// causal attention, activations.
//
// Each function here works on plain []float32 slices on the host and is written
// to be read: it is the specification that the backends' kernels (the CPU
// backend in backend/cpu, the CUDA kernels in kernels/) are tested against.
// Architecture-specific layers live in subpackages (layers/mhc, layers/dsa).
//
// This package owns no state and touches no weights files or devices.
package layers
