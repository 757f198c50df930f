package engine

import (
	"maps"
	"strings"

	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// Info describes a loaded model: what Model.Info returns.
type Info struct {
	// Architecture is config.json's model_type ("llama", "qwen3",
	// "deepseek_v32", "deepseek_v4").
	Architecture string
	// Parameters counts the checkpoint's weights: the elements of every
	// float tensor, two for each byte of a packed NVFP4 weight (two E2M1
	// codes a byte). The scales of NVFP4 and FP8 linears, and integer tables
	// (DeepSeek-V4's hash routing), are not counted; float buffers that
	// transformers does not call parameters (DeepSeek's router bias) are.
	Parameters int64
	// BytesByDType is the checkpoint's tensor data by stored dtype, named as
	// in safetensors ("BF16", "F32"; an NVFP4 checkpoint's packed codes are
	// "U8" and their block scales "F8_E4M3").
	BytesByDType map[string]int64
	// CheckpointBytes is the sum of BytesByDType. The weights take about as
	// much memory: on the CPU they are read from the memory-mapped files in
	// their stored format, on the GPU copied in it; F16 linears are widened
	// to float32 on both, and vectors (norms, biases) are read as float32.
	CheckpointBytes int64
	// Quantization is the quantization config's algorithm ("NVFP4",
	// "FP8_BLOCK"), or "" for an unquantized checkpoint.
	Quantization string
	// VocabSize, Layers and HiddenSize are config.json's vocab_size,
	// num_hidden_layers and hidden_size.
	VocabSize, Layers, HiddenSize int
	// MaxPositions is config.json's max_position_embeddings (0 if absent).
	MaxPositions int
	// ContextLength is the positions a new session holds by default
	// (Model.ContextLength).
	ContextLength int
	// Device is the backend the model runs on (Model.Device).
	Device string
	// CacheBytesPerToken is the cache memory each position of a session
	// takes: a session of n positions holds about n times this
	// (Session.CacheBytes tells a session's own). 0 after Close.
	CacheBytesPerToken int64
}

// Info describes the model. It may be called after Close (the checkpoint
// figures were taken at Load).
func (m *Model) Info() Info {
	cfg := m.cfg
	in := m.info
	in.BytesByDType = maps.Clone(m.info.BytesByDType)
	in.Architecture = cfg.ModelType
	in.VocabSize, in.Layers, in.HiddenSize = cfg.VocabSize, cfg.NumLayers, cfg.HiddenSize
	in.MaxPositions = cfg.MaxPositionEmbeddings
	in.ContextLength = m.ctxLen
	in.Device = m.Device()
	if m.acquire() == nil {
		if per, err := m.cacheBytesPerToken(); err == nil {
			in.CacheBytesPerToken = per
		}
		m.done()
	}
	return in
}

// checkpointInfo fills Info's figures of the checkpoint ck (quantized with
// algo): parameters and bytes by dtype.
func checkpointInfo(ck *weights.Checkpoint, algo string) Info {
	in := Info{BytesByDType: map[string]int64{}, Quantization: algo}
	packed := func(d weights.DType) bool { return d == weights.U8 || d == weights.I8 }
	low := func(d weights.DType) bool { return packed(d) || d == weights.F8E4M3 || d == weights.F8E5M2 }
	for _, name := range ck.Names() {
		t, err := ck.Tensor(name)
		if err != nil {
			continue
		}
		in.BytesByDType[t.DType.String()] += int64(len(t.Data))
		in.CheckpointBytes += int64(len(t.Data))
		switch n := int64(t.NumElements()); {
		case scaleOfLowPrecision(ck, name, low):
		case packed(t.DType) && strings.HasSuffix(name, nvfp4ckpt.SuffixWeight) &&
			nvfp4ckpt.Has(ck, strings.TrimSuffix(name, nvfp4ckpt.SuffixWeight)):
			in.Parameters += 2 * n
		case isFloat(t.DType):
			in.Parameters += n
		}
	}
	return in
}

// scaleSuffixes name the scale tensors of NVFP4 linears (both layouts) and
// of FP8 block linears (weight_scale_inv).
var scaleSuffixes = []string{
	nvfp4ckpt.SuffixWeightScale, nvfp4ckpt.SuffixWeightScale2, nvfp4ckpt.SuffixInputScale,
	nvfp4ckpt.SuffixInputGlobalScale, nvfp4ckpt.SuffixAlpha, nvfp4ckpt.SuffixWeightGlobalScale,
	nvfp4ckpt.SuffixInputAbsMax, ".weight_scale_inv",
}

// scaleOfLowPrecision reports whether name is a scale tensor of a linear
// whose weight is stored in a low-precision dtype (low).
func scaleOfLowPrecision(ck *weights.Checkpoint, name string, low func(weights.DType) bool) bool {
	for _, s := range scaleSuffixes {
		if module, ok := strings.CutSuffix(name, s); ok {
			if w, err := ck.Tensor(module + nvfp4ckpt.SuffixWeight); err == nil && low(w.DType) {
				return true
			}
		}
	}
	return false
}

func isFloat(d weights.DType) bool {
	switch d {
	case weights.F32, weights.F16, weights.BF16, weights.F64, weights.F8E4M3, weights.F8E5M2:
		return true
	}
	return false
}
