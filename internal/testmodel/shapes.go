package testmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/manifoldlm/manifold/weights"
)

// Model is what a named shape writes: a Llama or a DeepseekV4.
type Model interface {
	// Config is the config.json Write writes.
	Config() ([]byte, error)
	// Write creates the checkpoint in dir (which must exist), config.json last.
	Write(dir string) error
	// WriteProgress is Write, calling progress (when not nil) after each
	// tensor with the tensor bytes added so far and CheckpointBytes; an error
	// from progress stops the write (config.json unwritten) and is returned.
	WriteProgress(dir string, progress func(done, total int64) error) error
	// WeightBytes is the bytes of weights a decode step reads (see the
	// writers' own definitions).
	WeightBytes() int64
	// CheckpointBytes is the size of the tensor data Write writes.
	CheckpointBytes() int64
}

// Spec is a named shape: a real model's shape (or a tiny one for tests) and
// the random checkpoint writer that takes it. Its Model's methods are its
// own; its Write and WriteProgress also leave a stamp (StampFile) that
// Written recognizes.
type Spec struct {
	Name        string
	Description string // one line
	Model
}

// StampFile is the file Spec.Write leaves in the checkpoint folder, naming
// the shape and its writer's fields, so that Written can tell a folder
// holding this very checkpoint (seed and format included) from any other.
// It is written first, marked incomplete, and marked complete last: a folder
// holding it holds a random checkpoint, whole or being written.
const StampFile = ".testmodel-shape.json"

// shapes are the named shapes. Their linears are random NVFP4 (as the
// decode benchmarks use them) unless the name says bf16.
var shapes = map[string]Spec{
	"llama3-8b": {Description: "Llama-3-8B: 32 layers, hidden 4096, FFN 14336, GQA 32/8, vocab 128256; NVFP4 linears, bf16 embeddings and LM head",
		Model: Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256, DType: weights.BF16, NVFP4: true, Seed: 1}},
	"llama3.2-1b": {Description: "Llama-3.2-1B: 16 layers, hidden 2048, FFN 8192, GQA 32/8 (heads of 64), vocab 128256; NVFP4 linears, bf16 embeddings and untied LM head",
		Model: Llama{Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 128256, DType: weights.BF16, NVFP4: true, Seed: 1}},
	"llama-1b-32k": {Description: "issue 61's CPU shape: 16 layers, hidden 2048, FFN 8192, GQA 32/8 (heads of 64), vocab 32000; NVFP4 linears, bf16 embeddings and untied LM head",
		Model: Llama{Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 32000, DType: weights.BF16, NVFP4: true, Seed: 1}},
	"llama-1b-32k-bf16": {Description: "llama-1b-32k with every linear in bf16 (the CPU bf16 benchmark against llama.cpp F16)",
		Model: Llama{Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 32000, DType: weights.BF16, Seed: 1}},
	"qwen3-8b": {Description: "Qwen3-8B: 36 layers, hidden 4096, FFN 12288, GQA 32/8 (heads of 128) with q/k norms, vocab 151936; NVFP4 linears, bf16 embeddings and LM head",
		Model: Llama{Layers: 36, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6,
			Qwen3: true, DType: weights.BF16, NVFP4: true, Seed: 1}},
	"qwen3-8b-2l-bf16": {Description: "two layers of Qwen3-8B in bf16 with a 4096-token vocabulary: the long-position RoPE test's model (engine/testdata/longrope)",
		Model: Llama{Layers: 2, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 4096, Theta: 1e6,
			Qwen3: true, DType: weights.BF16, Seed: 54}},
	"deepseek-v4-bench": {Description: "DeepSeek-V4-Flash's shape (43 layers, hidden 4096, CSA/HCA, mHC, top-6 MoE) with 32 routed experts instead of 256: engine's BenchmarkDecodeDeepseekV4 model",
		Model: DeepseekV4{Experts: 32, Seed: 1}},
	"deepseek-v4-bench-mtp": {Description: "deepseek-v4-bench with its MTP block (mtp.0.*: one sliding-window layer of the same shape): the speculative-decoding benchmark's model (engine's BenchmarkSpeculativeV4 with MANIFOLD_BENCH_SPEC_SHAPE)",
		Model: DeepseekV4{Experts: 32, Seed: 1, MTP: true}},
	"deepseek-v4-flash": {Description: "DeepSeek-V4-Flash as released (deepseek-ai/DeepSeek-V4-Flash): 43 layers, hidden 4096, 256 routed experts in MXFP4, FP8 128x128-tile linears, DeepSeek's names, an MTP stand-in; 156 GB (145 GiB) on disk, as the release without its MTP block",
		Model: DeepseekV4{LayerTypes: v4FlashLayers(), Seed: 1, Released: V4FP8MXFP4}},
	"deepseek-v4-flash-32e": {Description: "deepseek-v4-flash with 32 routed experts instead of 256 (27 GB): the released format where the disk cannot hold all 256",
		Model: DeepseekV4{Experts: 32, LayerTypes: v4FlashLayers(), Seed: 1, Released: V4FP8MXFP4}},
	"deepseek-v4-flash-nvfp4": {Description: "nvidia/DeepSeek-V4-Flash-NVFP4's format: deepseek-v4-flash with the 256 routed experts in ModelOpt NVFP4; 165 GB (153 GiB) on disk",
		Model: DeepseekV4{LayerTypes: v4FlashLayers(), Seed: 1, Released: V4FP8NVFP4}},
	"tiny-llama": {Description: "a 2-layer Llama, hidden 64, FFN 128, 4 heads (2 KV) of 16, vocab 256; NVFP4 linears, bf16 the rest: for tests",
		Model: Llama{Layers: 2, Hidden: 64, FFN: 128, Heads: 4, KVHeads: 2, Vocab: 256, DType: weights.BF16, NVFP4: true, Seed: 1}},
}

// Shape returns the named shape (see ShapeNames).
func Shape(name string) (Spec, error) {
	s, ok := shapes[name]
	if !ok {
		return Spec{}, fmt.Errorf("testmodel: unknown shape %q (known: %s)", name, strings.Join(ShapeNames(), ", "))
	}
	s.Name = name
	return s, nil
}

// ShapeNames lists the named shapes, sorted.
func ShapeNames() []string {
	return slices.Sorted(maps.Keys(shapes))
}

// Shapes lists the named shapes, sorted by name.
func Shapes() []Spec {
	var out []Spec
	for _, name := range ShapeNames() {
		s, _ := Shape(name)
		out = append(out, s)
	}
	return out
}

// Write writes the checkpoint into dir (which must exist), between the
// two writes of the stamp.
func (s Spec) Write(dir string) error { return s.WriteProgress(dir, nil) }

// WriteProgress is Write, with the writer's progress calls.
func (s Spec) WriteProgress(dir string, progress func(done, total int64) error) error {
	if s.Model == nil {
		return fmt.Errorf("testmodel: shape %q has no model", s.Name)
	}
	stamp := func(complete bool) error {
		b, err := s.stamp(complete)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, StampFile), b, 0o644)
		}
		return err
	}
	if err := stamp(false); err != nil {
		return err
	}
	if err := s.Model.WriteProgress(dir, progress); err != nil {
		return err
	}
	return stamp(true)
}

// Written reports whether dir holds this shape's whole checkpoint, as Write
// left it: its stamp, marked complete, and its config.json.
func (s Spec) Written(dir string) bool {
	if s.Model == nil {
		return false
	}
	want, err := s.stamp(true)
	if err != nil {
		return false
	}
	have, err := os.ReadFile(filepath.Join(dir, StampFile))
	if err != nil || !bytes.Equal(have, want) {
		return false
	}
	cfg, err := s.Config()
	if err != nil {
		return false
	}
	have, err = os.ReadFile(filepath.Join(dir, "config.json"))
	return err == nil && bytes.Equal(have, cfg)
}

// stamp is StampFile's content: the name, the writer's type and fields, and
// whether the checkpoint is whole.
func (s Spec) stamp(complete bool) ([]byte, error) {
	fields, err := json.Marshal(s.Model)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(map[string]any{
		"shape": s.Name, "writer": fmt.Sprintf("%T", s.Model), "fields": json.RawMessage(fields), "complete": complete,
	}, "", "  ")
}

// v4FlashLayers is DeepSeek-V4-Flash's attention schedule (compress_ratios
// [0, 0] + [4, 128] x 20 + [4]): sliding layers 0 and 1, then CSA on even
// and HCA on odd layers.
func v4FlashLayers() []string {
	out := []string{V4Sliding, V4Sliding}
	for i := 2; i < 43; i++ {
		if i%2 == 0 {
			out = append(out, V4CSA)
		} else {
			out = append(out, V4HCA)
		}
	}
	return out
}

// WithLayers returns s cut (or grown) to n decoder layers, named
// NAME-Nl: the same layer shapes, formats and seed, so that a few layers of
// a checkpoint too large for the disk or the GPU (deepseek-v4-flash's 156
// GB) can be written and measured, the bytes a token reads per layer
// unchanged. A DeepSeek-V4 keeps the first n of its attention schedule (and
// of its hash-routed layers); a DeepSeek-V3 keeps its dense layers up to
// n-1 of them, so that at least one layer is MoE (n >= 2). n must be
// positive.
func (s Spec) WithLayers(n int) (Spec, error) {
	if n <= 0 {
		return Spec{}, fmt.Errorf("testmodel: %d layers: want at least 1", n)
	}
	out := s
	out.Name = fmt.Sprintf("%s-%dl", s.Name, n)
	switch m := s.Model.(type) {
	case Llama:
		m.Layers = n
		out.Model = m
	case DeepseekV3:
		m = m.withDefaults()
		if n < 2 {
			return Spec{}, fmt.Errorf("testmodel: %s: %d layer: want at least 2 (a dense layer, then a MoE layer)", s.Name, n)
		}
		m.Layers, m.DenseLayers = n, min(m.DenseLayers, n-1)
		out.Model = m
	case Qwen3MoE:
		m.Layers = n
		out.Model = m
	case DeepseekV4:
		m = m.withDefaults()
		if n > len(m.LayerTypes) {
			return Spec{}, fmt.Errorf("testmodel: %s has %d layers, asked for %d", s.Name, len(m.LayerTypes), n)
		}
		m.Layers, m.LayerTypes = n, slices.Clone(m.LayerTypes[:n])
		if m.HashLayers == 0 {
			m.HashLayers = -1 // none (withDefaults' 0 would be 3)
		}
		m.HashLayers = min(m.HashLayers, n)
		out.Model = m
	default:
		return Spec{}, fmt.Errorf("testmodel: shape %s (%T) has no layer count to set", s.Name, s.Model)
	}
	out.Description = fmt.Sprintf("the first %d decoder layers of: %s", n, s.Description)
	return out, nil
}
