// Package convert converts a Hugging Face safetensors checkpoint to NVFP4 in
// NVIDIA ModelOpt's layout; cmd/convert is its command line.
//
// The source may be F32, BF16, F16 or FP8 E4M3 with DeepSeek's block scales
// (<m>.weight_scale_inv, blocks from quantization_config.weight_block_size,
// default 128x128). Linear layers of attention, MLP and experts (recognised
// by name and 2-D shape: q_proj ... down_proj, DeepSeek's q_a_proj,
// kv_b_proj, wq_a, wkv, wo_a, w1/w2/w3, ...) become <m>.weight (U8 [N, K/2]),
// <m>.weight_scale (F8_E4M3 [N, K/16]) and <m>.weight_scale_2 (F32 scalar),
// quantized exactly as ModelOpt does. Embeddings, lm_head, norms,
// routers/gates, mHC parameters, biases and other tensors are written in
// BF16; integer tensors are copied. No input_scale is written: there is no
// activation calibration, and the CPU backend keeps activations in float32.
//
// DeepSeek-V4 as released converts as it ships: its FP8 linears carry their
// block scales in <m>.scale (F8_E8M0, or F32 in -Base); its MXFP4 routed
// experts (I8 codes, F8_E8M0 <m>.scale per 32 inputs) are re-blocked to
// NVFP4 without changing a weight (Report.Reblocked; a tensor whose scales
// span more than NVFP4 holds is requantized and reported instead); the
// float32 tensors it computes in float32 (mHC, sinks, ape, router bias) stay
// float32; expert_dtype and moe_quant_algo leave config.json.
//
// Options.Exclude takes module names or path.Match patterns
// ("lm_head", "model.layers.*.self_attn.*") to keep in BF16.
//
// Convert streams one tensor at a time (peak memory is a small multiple of
// the largest tensor, reported at the end), uses all cores, can show a
// progress bar with ETA, writes sharded output with an index, copies config
// and tokenizer files, writes hf_quant_config.json and config.json's
// quantization_config, and returns an accuracy report (relative RMS error of
// every quantized tensor; Report.Write lists the worst ones). It writes into
// a temporary directory beside the output and renames it at the end: the
// input is never modified, and an interrupted or failed run leaves no
// output directory. A run killed outright (SIGKILL) leaves its temporary
// directory, .NAME.tmp-*, which holds a lock file (flock) for as long as
// its conversion runs: the next conversion to the same name removes those
// whose lock is free and reports them (Report.StaleRemoved, StaleLeft).
//
// The package owns the conversion only: reading NVFP4 checkpoints and their
// config belongs to weights/nvfp4ckpt, the number formats to quant, flags and
// signals to cmd/convert. It holds no package-level mutable state.
package convert
