// Package model parses a checkpoint's config.json and generation_config.json
// and defines the architectures: one small file each (llama.go, qwen3.go,
// deepseek_v32.go, deepseek_v4.go), whose forward pass reads top to bottom like
// the paper and calls only the backend.Backend interface.
//
// Weights are bound to an architecture's structs by struct tags (see Bind),
// which also check every tensor's shape against the config, so a checkpoint
// that disagrees with its config fails at load with the tensor's name.
//
// This package owns no compute kernels (backend/...), no file formats
// (weights/, quant/) and no sampling or sessions (engine/).
package model
