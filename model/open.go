package model

import (
	"errors"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// Folder is a model folder read once: config.json, generation_config.json,
// the quantization config and the safetensors checkpoint (memory-mapped, or
// copied into memory with ReadFolderWith; single or sharded). Build makes architectures from it on any backend
// without reading the folder again. Close it after every model built from
// it is done: the weights may point into its memory maps.
type Folder struct {
	Dir        string
	Config     *Config
	Generation *GenerationConfig   // zero when the folder has none
	Quant      *nvfp4ckpt.Config   // nil for an unquantized checkpoint
	Checkpoint *weights.Checkpoint // open until Close
}

// ReadFolder reads the model folder dir, memory-mapping its checkpoint.
// Every error names the file and, where there is one, the field.
func ReadFolder(dir string) (*Folder, error) { return ReadFolderWith(dir, weights.OpenOptions{}) }

// ReadFolderWith reads the model folder dir as ReadFolder does, opening the
// checkpoint with o (o.Copy reads it into memory instead of mapping it).
func ReadFolderWith(dir string, o weights.OpenOptions) (*Folder, error) {
	f := &Folder{Dir: dir}
	var err error
	if f.Config, err = LoadConfig(dir); err == nil {
		f.Generation, err = LoadGenerationConfig(dir)
	}
	// An unknown or malformed quantization config is an error here, before
	// any tensor is read; NVFP4 linears are then found by their scale tensors.
	if err == nil {
		f.Quant, err = nvfp4ckpt.ReadConfig(dir)
	}
	if err == nil {
		f.Checkpoint, err = weights.OpenWith(dir, o)
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Close releases the checkpoint.
func (f *Folder) Close() error { return f.Checkpoint.Close() }

// Options configure an architecture at construction.
type Options struct {
	// Attention chooses dense or htree attention where the architecture
	// offers a choice.
	Attention AttentionOptions
	// MTP loads the multi-token-prediction block of the architectures that
	// carry one (DeepSeek-V4's mtp.0.*), for speculative decoding
	// (Drafter); without it the block is not read.
	MTP bool
	// Experts places the routed experts on the device or in host memory
	// (DeepSeek-V4; offload.go). The zero value plans from free memory.
	Experts ExpertPlacement
}

// Build makes the architecture named by the folder's config on backend b.
// The backend's optional op groups are asked once, here: an architecture
// that needs a group b lacks fails with an error naming it.
func Build(b backend.Backend, f *Folder, o Options) (Model, error) {
	cfg := f.Config
	ctor, ok := architectures[cfg.ModelType]
	if !ok {
		return nil, fmt.Errorf("model: %s: unknown architecture %q; supported: %v", cfg.Path, cfg.ModelType, Supported())
	}
	if err := o.Attention.validate(); err != nil {
		return nil, err
	}
	if err := o.Experts.validate(); err != nil {
		return nil, fmt.Errorf("model: %s: %w", cfg.Path, err)
	}
	if err := checkSizes(cfg, f.Checkpoint); err != nil {
		return nil, err
	}
	l := &Loader{b: b, ck: f.Checkpoint, caps: backend.CapabilitiesOf(b)}
	if f.Quant != nil {
		l.fp8Block = f.Quant.BlockSize // FP8 tiles: weight_block_size (zero: the default)
	}
	m, err := ctor(b, cfg, l, o)
	if err != nil {
		return nil, err
	}
	if _, ok := m.(ExpertPlanner); !ok && o.Experts.offloads() {
		return nil, fmt.Errorf("model: %s: %w: mode %q: %s keeps every weight on the device (DeepSeek-V4 places its routed experts)", cfg.Path, ErrPlacement, o.Experts.Mode, cfg.ModelType)
	}
	return m, nil
}

// Open reads the folder dir and builds its architecture on b: ReadFolder
// then Build. Close the returned folder when done with the model.
func Open(dir string, b backend.Backend, o Options) (*Folder, Model, error) {
	f, err := ReadFolder(dir)
	if err != nil {
		return nil, nil, err
	}
	m, err := Build(b, f, o)
	if err != nil {
		return nil, nil, errors.Join(err, f.Close())
	}
	return f, m, nil
}
