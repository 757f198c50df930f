// Command convert converts a Hugging Face safetensors checkpoint to NVFP4 in
// NVIDIA ModelOpt's layout.
//
// Usage:
//
//	convert -in DIR -out DIR [-exclude PATTERNS] [-shard-size MB] [-workers N] [-worst N] [-quiet]
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
// -exclude takes comma-separated module names or path.Match patterns
// ("lm_head,model.layers.*.self_attn.*") to keep in BF16; it may be repeated.
//
// The conversion streams one tensor at a time (peak memory is a small
// multiple of the largest tensor, reported at the end), uses all cores, shows
// a progress bar with ETA on stderr, writes sharded output with an index,
// copies config and tokenizer files, writes hf_quant_config.json and
// config.json's quantization_config, and prints an accuracy report
// (relative RMS error of every quantized tensor, the worst ones listed) on
// stdout. It writes into a temporary directory beside -out and renames it at
// the end: the input is never modified, and an interrupted or failed run
// leaves no -out directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	in := fs.String("in", "", "input checkpoint directory (Hugging Face layout)")
	out := fs.String("out", "", "output directory (must not exist)")
	var exclude listFlag
	fs.Var(&exclude, "exclude", "comma-separated modules or path.Match patterns to keep in BF16 (repeatable)")
	shardMB := fs.Int64("shard-size", 5000, "maximum shard size in MB (10^6 bytes)")
	workers := fs.Int("workers", 0, "goroutines for the numeric work (0: all cores)")
	worst := fs.Int("worst", 10, "number of worst tensors to list in the accuracy report")
	quiet := fs.Bool("quiet", false, "no progress bar")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *in == "" || *out == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: convert -in DIR -out DIR [-exclude PATTERNS] [-shard-size MB] [-workers N] [-worst N] [-quiet]")
		return 2
	}
	if *shardMB <= 0 {
		fmt.Fprintln(os.Stderr, "convert: -shard-size must be positive")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := Options{In: *in, Out: *out, Exclude: exclude, ShardBytes: *shardMB * 1e6, Workers: *workers}
	if !*quiet {
		opts.Progress = os.Stderr
		if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			opts.ProgressTTY = true
		}
	}
	rep, err := Convert(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rep.Write(os.Stdout, *worst)
	return 0
}
