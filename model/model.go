package model

import (
	"context"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant/nvfp4ckpt"
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
type constructor func(b backend.Backend, cfg *Config, w *Loader) (Model, error)

// architectures maps model_type to its constructor. It is fixed at compile
// time and never modified.
var architectures = map[string]constructor{
	"deepseek_v32": newDeepseekV32,
	"deepseek_v4":  newDeepseekV4,
	"llama":        newLlama,
	"qwen3":        newQwen3,
}

// New builds the architecture named by cfg.ModelType from the checkpoint.
func New(b backend.Backend, cfg *Config, ck *weights.Checkpoint) (Model, error) {
	ctor, ok := architectures[cfg.ModelType]
	if !ok {
		return nil, fmt.Errorf("model: unknown architecture %q; supported: %v", cfg.ModelType, Supported())
	}
	// An unknown or malformed quantization config is an error here, before
	// any tensor is read; NVFP4 linears are then found by their scale tensors.
	if _, err := nvfp4ckpt.ReadConfig(ck.Dir()); err != nil {
		return nil, err
	}
	// Every layer has tensors of its own: a layer count past the checkpoint's
	// tensor count is a config error here, before anything is sized by it.
	if n := len(ck.Names()); cfg.NumLayers > n {
		return nil, configErr(cfg.Path, "num_hidden_layers", "%d layers, but checkpoint %s holds only %d tensors",
			cfg.NumLayers, ck.Dir(), n)
	}
	return ctor(b, cfg, NewLoader(b, ck))
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
