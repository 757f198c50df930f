// Package nvfp4ckpt reads NVFP4-quantized linear layers out of safetensors
// checkpoints into quant.NVFP4, and parses the quantization config that says
// which modules are quantized.
//
// Two tensor layouts load into the one representation:
//
//   - ModelOpt (NVIDIA Model Optimizer's unified Hugging Face export):
//     <m>.weight U8 [N, K/2] (two E2M1 codes a byte, even element in the low
//     nibble), <m>.weight_scale F8_E4M3 [N, K/16] (plain row-major),
//     <m>.weight_scale_2 F32 scalar (amax/2688, multiply convention) and
//     optionally <m>.input_scale F32 scalar.
//   - LightX2V (seed 004): <m>.weight U8 [N, K/2], <m>.weight_scale F8_E4M3
//     in the swizzled 128x4 layout (rows padded to 128, scale columns to 4),
//     <m>.input_global_scale (2688/input amax) and <m>.alpha
//     (1/(input_global_scale*weight_global_scale)), or <m>.weight_global_scale
//     (2688/amax) and <m>.input_absmax.
//
// The quantization config is hf_quant_config.json ({"quantization":
// {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}}) or the
// quantization_config object of config.json (ModelOpt's "quant_method":
// "modelopt" form with quant_algo, exclude_modules or ignore, and
// config_groups), and, for source checkpoints, DeepSeek's FP8 block format
// ("quant_method": "fp8", "weight_block_size": [128, 128]).
//
// The package owns these layouts and config formats only: it must not know
// model architectures (which tensors a model has; package model does), run
// computations on the weights (package quant and the backends do), or write
// checkpoints (weights/convert does).
package nvfp4ckpt
