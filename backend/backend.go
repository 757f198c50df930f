// Package backend defines the compute interface that model code runs on: device
// buffers of float32 activations, weights resident on the device in their
// stored format, and operations at the granularity a GPU wants (a whole
// matmul, a whole norm over many rows, attention over a KV cache).
//
// Model code (package model) calls only this interface, so the same forward pass
// runs on the pure-Go CPU backend (backend/cpu) and on the CUDA backend
// (kernels/). Nothing crosses the interface per element.
//
// Operations only some architectures need (sparse MLA attention, compressed
// attention, hyper-connections, htree, device MoE routing) are declared in
// ops.go as groups a backend implements whole; a model asks for the groups
// it needs once, at load (CapabilitiesOf), and reports a clear error naming
// a group the backend lacks. Every op's reference math is in layers/....
//
// This package owns the interface and the host-side weight description only; it
// holds no state and does no compute.
package backend

import (
	"errors"
	"fmt"

	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

// Buffer is a device-resident array of float32 values.
type Buffer interface {
	Len() int
}

// Weight is a matrix of Rows output features by Cols input features resident on
// the device in its stored format (f32, f16, bf16 or NVFP4), with an optional
// bias.
type Weight interface {
	Rows() int
	Cols() int
	Format() Format
}

// Format is how a weight's values are stored.
type Format uint8

// ErrUnsupportedFormat is wrapped by Upload's error for a weight format the
// backend cannot hold yet (the block-scaled formats on a backend without
// their kernels, say).
var ErrUnsupportedFormat = errors.New("weight format not supported by this backend")

// The weight formats a backend accepts.
const (
	F32 Format = iota
	F16
	BF16
	NVFP4
	// FP8Block is FP8 E4M3 with one scale per BlockRows x BlockCols tile
	// (HostWeight.FP8: DeepSeek V3/V4's fine-grained FP8; the scale type,
	// E8M0 or f32, is data in quant.FP8Block.ScaleDType).
	FP8Block
	// MXFP4 is E2M1 with one E8M0 scale per 32 inputs (HostWeight.MX:
	// DeepSeek-V4's routed experts).
	MXFP4
)

func (f Format) String() string {
	switch f {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case NVFP4:
		return "nvfp4"
	case FP8Block:
		return "fp8block"
	case MXFP4:
		return "mxfp4"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// BytesPerValue is the storage size of one weight value (scales included for NVFP4).
func (f Format) BytesPerValue() float64 {
	switch f {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case NVFP4:
		return 0.5 + 1.0/16
	case FP8Block:
		return 1 // plus one scale per tile, under 0.1% at 128x128
	case MXFP4:
		return 0.5 + 1.0/32
	}
	return 0
}

// HostWeight describes a weight on the host before upload. For F32, F16 and
// BF16, Data holds Rows*Cols little-endian values, row-major (the layout of a
// safetensors tensor, which may be a slice of a memory map: it is never
// written). For NVFP4, Q holds the quantized matrix; for FP8Block, FP8; for
// MXFP4, MX (each sharing the checkpoint's memory, never written).
type HostWeight struct {
	Name       string
	Rows, Cols int
	Format     Format
	Data       []byte
	Q          *quant.NVFP4
	FP8        *quant.FP8Block
	MX         *quant.MXFP4
	Bias       []float32 // len Rows, or nil
}

// Validate checks that the description is self-consistent, naming the weight.
func (w *HostWeight) Validate() error {
	if w.Rows <= 0 || w.Cols <= 0 {
		return fmt.Errorf("weight %s: bad shape [%d, %d]", w.Name, w.Rows, w.Cols)
	}
	switch w.Format {
	case F32, F16, BF16:
		want := w.Rows * w.Cols * int(w.Format.BytesPerValue())
		if len(w.Data) != want {
			return fmt.Errorf("weight %s: %s [%d, %d] needs %d bytes, has %d", w.Name, w.Format, w.Rows, w.Cols, want, len(w.Data))
		}
	case NVFP4:
		if w.Q == nil || w.Q.Rows != w.Rows || w.Q.Cols != w.Cols {
			return fmt.Errorf("weight %s: nvfp4 matrix missing or not [%d, %d]", w.Name, w.Rows, w.Cols)
		}
	case FP8Block:
		if w.FP8 == nil || w.FP8.Rows != w.Rows || w.FP8.Cols != w.Cols {
			return fmt.Errorf("weight %s: fp8 block matrix missing or not [%d, %d]", w.Name, w.Rows, w.Cols)
		}
		if err := w.FP8.Validate(); err != nil {
			return fmt.Errorf("weight %s: %w", w.Name, err)
		}
	case MXFP4:
		if w.MX == nil || w.MX.Rows != w.Rows || w.MX.Cols != w.Cols {
			return fmt.Errorf("weight %s: mxfp4 matrix missing or not [%d, %d]", w.Name, w.Rows, w.Cols)
		}
		if err := w.MX.Validate(); err != nil {
			return fmt.Errorf("weight %s: %w", w.Name, err)
		}
	default:
		return fmt.Errorf("weight %s: unknown format %s", w.Name, w.Format)
	}
	if w.Bias != nil && len(w.Bias) != w.Rows {
		return fmt.Errorf("weight %s: bias has %d values, want %d", w.Name, len(w.Bias), w.Rows)
	}
	return nil
}

// KVCache holds the keys and values of every attention layer of one sequence,
// on the device. Positions are appended by Backend.Attention.
type KVCache interface {
	// Len is the number of positions stored (the same for every layer once a
	// forward pass completes).
	Len() int
	// Cap is the number of positions the cache can hold.
	Cap() int
	// Truncate drops every position from n on, so a session can rewind.
	Truncate(n int)
	// Bytes is the device memory the cache holds.
	Bytes() int64
}

// KVShape is the geometry of a KV cache.
type KVShape struct {
	Layers   int
	KVHeads  int
	HeadDim  int
	Capacity int // positions
}

// Backend is the compute interface. Every Buffer and Weight passed to a
// backend's methods must have been made by that backend. A Backend is safe for
// concurrent use by several sessions as long as they do not share buffers.
//
// Sizes are given explicitly: m is a number of rows (tokens), n a row width.
type Backend interface {
	// Name identifies the backend and its device, for logs ("cpu (2 threads)").
	Name() string

	// NewBuffer allocates n zeroed values.
	NewBuffer(n int) Buffer
	// View is the window [off, off+n) of b, sharing its memory.
	View(b Buffer, off, n int) Buffer
	// Write copies src into b from offset off.
	Write(b Buffer, off int, src []float32)
	// Read copies len(dst) values of b from offset off into dst.
	Read(dst []float32, b Buffer, off int)
	// Upload puts a weight on the device in its stored format.
	Upload(w *HostWeight) (Weight, error)
	// NewKVCache allocates a KV cache.
	NewKVCache(s KVShape) (KVCache, error)

	// Embed writes rows ids of table (a [vocab, n] weight) into dst [len(ids), n] as float32.
	Embed(dst Buffer, table Weight, ids []int32)
	// MatMul computes dst[m, w.Rows] = x[m, w.Cols] · wᵀ (+ bias).
	MatMul(dst, x Buffer, w Weight, m int)
	// RMSNorm normalizes rows of len(weight) values: dst = x/rms(x) * weight. dst may be x.
	RMSNorm(dst, x, weight Buffer, eps float32)
	// RoPE rotates channels [off, off+r.Dim()) of each of the rows*heads
	// vectors (stride values apart) of x in place; row i is at position pos0+i.
	RoPE(x Buffer, rows, heads, stride, off, pos0 int, r *layers.RoPE, inverse bool)
	// Attention appends k and v ([m, KVHeads, HeadDim]) to the cache's layer
	// at positions pos0.., then writes causal attention of q ([m, Heads,
	// HeadDim]) over positions [0, pos0+m) into out ([m, Heads, HeadDim]).
	Attention(out, q, k, v Buffer, cache KVCache, layer, pos0, m int, s layers.AttentionShape)
	// SwiGLU computes dst = silu(gate) * up elementwise (clamped when limit > 0).
	SwiGLU(dst, gate, up Buffer, limit float32)
	// Add computes dst = a + b elementwise.
	Add(dst, a, b Buffer)
	// Scale computes dst = a * s elementwise.
	Scale(dst, a Buffer, s float32)
	// Copy copies src into dst (same length).
	Copy(dst, src Buffer)
	// GatherRows copies row rows[i] of src ([*, w]) to row i of dst (MoE
	// dispatch).
	GatherRows(dst, src Buffer, rows []int32, w int)
	// ScatterAddRows adds scale[i] * row i of src to row rows[i] of dst ([*,
	// w]) (MoE combine).
	ScatterAddRows(dst, src Buffer, rows []int32, scale []float32, w int)

	// Sync waits for queued work to finish (a no-op on the CPU).
	Sync() error
	// Close frees the device resources of the backend.
	Close() error
}

// TokenSampler is implemented by backends that pick the next token where the
// logits are, so that only the token id crosses to the host.
type TokenSampler interface {
	// SampleToken picks a token from logits (one row of vocabulary size):
	// the first maximum when temperature <= 0; otherwise a draw, by the
	// uniform number u in [0, 1), from the softmax of logits/temperature over
	// the topK largest (ties to the lower id; topK <= 0 or past
	// MaxSampleTopK is an error). Candidates are taken from the most likely
	// down, so the same u draws the same token on every backend. A NaN
	// logit is an error naming it: no token is drawn.
	SampleToken(logits Buffer, temperature float32, topK int, u float64) (int, error)
}

// TokenPipeliner is implemented by TokenSamplers that can keep a picked token
// on the device, so that the step which runs it is queued before its id has
// reached the host: the host's round trip then overlaps the next step.
type TokenPipeliner interface {
	TokenSampler
	// SampleTokenTo is SampleToken without the wait: the pick is written to
	// dst (a buffer of one element, holding the id as an int32) and reaches
	// the host through the returned PendingToken.
	SampleTokenTo(dst, logits Buffer, temperature float32, topK int, u float64) (PendingToken, error)
	// EmbedToken is Embed of the one token id that src holds (as written by
	// SampleTokenTo, earlier in queue order).
	EmbedToken(dst Buffer, table Weight, src Buffer)
}

// PendingToken is a token picked on the device whose id is on its way to
// the host.
type PendingToken interface {
	// Wait blocks until the id has arrived and returns it, or the first
	// error of the backend's work queued before it.
	Wait() (int, error)
}

// SamplePick is one pick of BatchTokenSampler.SampleTokens: the row of
// logits it reads and TokenSampler.SampleToken's options.
type SamplePick struct {
	Row         int
	Temperature float32
	TopK        int
	U           float64
}

// BatchTokenSampler is implemented by backends that pick the tokens of
// several rows of logits at once (the sequences of a batched step), each
// with its own options, where the logits are: only the ids come back.
type BatchTokenSampler interface {
	// SampleTokens sets ids[i] to SampleToken of row picks[i].Row of
	// logits ([rows, vocab]) with picks[i]'s options. A NaN logit in a
	// picked row is an error naming the row and the logit.
	SampleTokens(ids []int, logits Buffer, vocab int, picks []SamplePick) error
}

// MaxSampleTopK bounds TokenSampler's topK.
const MaxSampleTopK = 256

// Experts is a MoE layer's routed experts as a backend that runs them on its
// device holds them (ExpertBinder).
type Experts interface {
	// NumExperts is the number of routed experts.
	NumExperts() int
}

// ExpertBinder is implemented by backends that run a MoE layer's routed
// experts on their device, picked there with no host round trip.
type ExpertBinder interface {
	// BindExperts prepares a layer's routed experts (w1 gate and w3 up
	// [ffn, hidden], w2 down [hidden, ffn] of each, in expert order) and
	// router bias ([Experts] or nil). It returns nil, nil when the backend
	// cannot run them (weight format or shapes): the caller keeps its host
	// path.
	BindExperts(w1, w3, w2 []Weight, bias []float32) (Experts, error)
	// MaxDeviceMoETokens is the most tokens one call should route on the
	// device: the device path reads each token's experts' weights once a
	// token, the host path (routing on the host, a MatMul per picked expert
	// over its rows) once a chunk, which wins for longer chunks.
	MaxDeviceMoETokens() int
}

// GroupMoEOps is implemented by backends that route DeepSeek-V3-style MoE
// (layers.GroupRoute) and run the routed experts on their device.
type GroupMoEOps interface {
	ExpertBinder
	// GroupMoE routes the a.M tokens of logits ([M, Experts]) as
	// layers.GroupRoute does (with the bias given to BindExperts) and adds
	// each token's routed experts to out ([M, hidden]): out[i] += sum_j w_ij
	// W2_j SwiGLU(W1_j x_i, W3_j x_i), the experts added in expert order.
	GroupMoE(out, x, logits Buffer, ex Experts, a layers.GroupRouteArgs)
}

// SoftmaxMoEOps is implemented by backends that route Qwen3-MoE-style MoE
// (layers.SoftmaxRoute) and run the routed experts on their device, so that
// a decode step reads nothing back to the host.
type SoftmaxMoEOps interface {
	ExpertBinder
	// SoftmaxMoE routes the a.M tokens of logits ([M, Experts]) as
	// layers.SoftmaxRoute does and adds each token's routed experts to out
	// ([M, hidden]): out[i] += sum_j w_ij W2_j SwiGLU(W1_j x_i, W3_j x_i),
	// the experts added in expert order.
	SoftmaxMoE(out, x, logits Buffer, ex Experts, a layers.SoftmaxRouteArgs)
}
