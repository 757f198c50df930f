// Package model parses a checkpoint's config.json and generation_config.json
// and defines the architectures: one small file each (llama.go, qwen3.go,
// qwen3_moe.go, deepseek_v3.go, deepseek_v32.go, deepseek_v4.go; moe.go holds
// what the MoE families share), whose forward pass reads top to bottom like
// the paper and calls only the backend.Backend interface. Linear weights keep
// their stored format: f32, bf16, f16, NVFP4, MXFP4, or FP8 E4M3 with a scale
// per block (DeepSeek-V3's float32 weight_scale_inv, V4's scale).
//
// Weights are bound to an architecture's structs by struct tags (see Bind),
// which also check every tensor's shape against the config, so a checkpoint
// that disagrees with its config fails at load with the tensor's name.
//
// Load errors are classified for errors.Is and errors.As, and name the file
// and, where there is one, the field or tensor: a config field out of range,
// or a tensor whose shape (or content) disagrees with what the config
// implies, wraps ErrConfig; a problem of the checkpoint file itself (a
// missing tensor, a truncated file, a tensor in a dtype the engine cannot
// use) is a *weights.Error wrapping one of package weights' sentinels, or
// for a linear weight's dtype nvfp4ckpt.ErrUnsupportedDType. A Qwen3 layer
// without its q/k norms wraps both ErrConfig and weights.ErrMissingTensor.
//
// This package owns no compute kernels (backend/...), no file formats
// (weights/, quant/) and no sampling or sessions (engine/).
package model
