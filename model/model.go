package model

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/weights"
)

// Model is a loaded architecture: weights on a backend and a forward pass.
// A Model is safe for concurrent use by several States.
type Model interface {
	// Config is the parsed config.json.
	Config() *Config
	// NewState allocates the per-sequence state (KV caches and scratch) for up
	// to capacity positions.
	NewState(capacity int) (State, error)
	// Forward runs tokens at positions st.Len(), st.Len()+1, ... and appends
	// them to the state. It returns the logits of every token ([len(tokens),
	// vocab]) when all is set, else those of the last token only ([vocab]).
	Forward(ctx context.Context, st State, tokens []int32, all bool) ([]float32, error)
}

// StateSizer is implemented by models whose states' memory is not
// proportional to their capacity (DeepSeek-V4: compressed caches that grow
// by a fraction of a key a position, plus sliding windows and compressor
// rows that do not grow), so that a caller can check a capacity against the
// memory it has before NewState allocates it.
type StateSizer interface {
	// StateBytes is the memory a state of capacity positions takes on the
	// backend once it has run a prompt (caches and forward-pass scratch).
	StateBytes(capacity int) int64
}

// DeviceForwarder is implemented by models that can leave the logits on the
// backend, so that a backend.TokenSampler picks the next token there.
type DeviceForwarder interface {
	// ForwardDevice is Forward for the last token's logits, returned as a
	// backend buffer that stays valid until the next call with st.
	ForwardDevice(ctx context.Context, st State, tokens []int32) (backend.Buffer, error)
}

// SampledForwarder is implemented by models that can run a token the backend
// picked and kept on the device (backend.TokenPipeliner) before its id has
// reached the host, so that the round trip overlaps the step.
type SampledForwarder interface {
	DeviceForwarder
	// ForwardSampled is ForwardDevice for the one token whose id src holds
	// (written by SampleTokenTo, earlier in the backend's queue).
	ForwardSampled(ctx context.Context, st State, src backend.Buffer) (backend.Buffer, error)
}

// BatchForwarder is implemented by models that run one step over several
// sequences at once (continuous batching, engine's scheduler): the matmuls
// cover the stacked rows of every sequence, so each weight is read once a
// step, and attention runs per sequence over its own cache.
type BatchForwarder interface {
	// ForwardBatch runs tokens[i] on sts[i] (appended at sts[i].Len()...)
	// for every i and returns the logits of each sequence's last token,
	// [len(sts), vocab], row i for sts[i]. Each row is the one Forward of
	// that sequence alone returns (bit for bit where the backend's matmul
	// rows are independent of each other, as on the CPU). The states must
	// be distinct. On error (ctx's included) every state is left as it was.
	ForwardBatch(ctx context.Context, sts []State, tokens [][]int32) ([]float32, error)
}

// BatchDeviceForwarder is implemented by BatchForwarders that can leave a
// step's logits on the backend, so that a backend.BatchTokenSampler picks
// the sequences' tokens there and only their ids come back.
type BatchDeviceForwarder interface {
	// ForwardBatchDevice is ForwardBatch returning the logits ([len(sts),
	// vocab]) as a backend buffer, valid until the next batched call.
	ForwardBatchDevice(ctx context.Context, sts []State, tokens [][]int32) (backend.Buffer, error)
}

// hostLogits is the end of a model's Forward: the pass's logits, read back
// to the host, or the pass's error.
func hostLogits(b backend.Backend, logits backend.Buffer, err error) ([]float32, error) {
	if err != nil {
		return nil, err
	}
	out := make([]float32, logits.Len())
	b.Read(out, logits, 0)
	return out, b.Sync()
}

// State is one sequence's cache on the backend. It is not safe for concurrent use.
type State interface {
	// Len is the number of positions processed.
	Len() int
	// Cap is the number of positions the state can hold.
	Cap() int
	// Truncate forgets every position from n on.
	Truncate(n int)
	// CacheBytes is the device memory held by the caches.
	CacheBytes() int64
	// CacheBytesPerToken is the cache memory each further position costs.
	CacheBytesPerToken() int64
}

// constructor builds an architecture from its config and weights.
type constructor func(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error)

// architectures maps model_type to its constructor. It is fixed at compile
// time and never modified.
var architectures = map[string]constructor{
	"deepseek_v3":  newDeepseekV3,
	"deepseek_v32": newDeepseekV32,
	"deepseek_v4":  newDeepseekV4,
	"llama":        newLlama,
	"qwen3":        newQwen3,
	"qwen3_moe":    newQwen3MoE,
}

// widthFields are the config.json fields of every architecture that give a
// width or a count of the weights: each sizes at least one tensor, so none
// can exceed the checkpoint's element count.
var widthFields = []string{
	"hidden_size", "intermediate_size", "moe_intermediate_size", "vocab_size", "head_dim",
	"num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "o_lora_rank", "o_groups",
	"qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim", "index_n_heads", "hc_mult",
	"n_routed_experts", "n_shared_experts", "num_experts",
}

// checkSizes refuses sizes that the checkpoint cannot back before anything
// is allocated by them (the architectures size rotation tables and scratch
// from the config before their first shape check): every layer has tensors
// of its own, and no width exceeds the checkpoint's element count (at most
// two per byte, as NVFP4 packs them). Sizes in range but wrong get the shape
// checks' errors, which name the tensor.
func checkSizes(cfg *Config, ck *weights.Checkpoint) error {
	names := ck.Names()
	if cfg.NumLayers > len(names) {
		return configErr(cfg.Path, "num_hidden_layers", "%d layers, but checkpoint %s holds only %d tensors",
			cfg.NumLayers, ck.Dir(), len(names))
	}
	var bytes int64
	for _, name := range names {
		if t, err := ck.Tensor(name); err == nil {
			bytes += int64(len(t.Data))
		}
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(cfg.Raw, &raw) != nil {
		return nil // ParseConfig has read it; a nested text_config is the architecture's
	}
	for _, f := range widthFields {
		var v float64
		if json.Unmarshal(raw[f], &v) == nil && v > 2*float64(bytes) {
			return configErr(cfg.Path, f, "%g is more than the %d bytes of weights in checkpoint %s can hold", v, bytes, ck.Dir())
		}
	}
	return nil
}

// checkRange reports tokens that are not in [0, vocab) and a state too small.
func checkForward(cfg *Config, st State, tokens []int32) error {
	if len(tokens) == 0 {
		return fmt.Errorf("model: forward with no tokens")
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return fmt.Errorf("model: token %d at index %d is outside the vocabulary [0, %d)", t, i, cfg.VocabSize)
		}
	}
	if st.Len()+len(tokens) > st.Cap() {
		return fmt.Errorf("model: %d tokens after %d cached exceed the context of %d positions", len(tokens), st.Len(), st.Cap())
	}
	return nil
}
