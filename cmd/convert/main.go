// Command convert converts a Hugging Face safetensors checkpoint to NVFP4 in
// NVIDIA ModelOpt's layout (see package weights/convert for what is quantized,
// what is kept in BF16, and the guarantees about the output).
//
// Usage:
//
//	convert -in DIR -out DIR [-exclude PATTERNS] [-shard-size MB] [-workers N] [-worst N] [-quiet]
//
// -exclude takes comma-separated module names or path.Match patterns
// ("lm_head,model.layers.*.self_attn.*") to keep in BF16; it may be repeated.
//
// A progress bar with ETA goes to stderr (unless -quiet) and the accuracy
// report (relative RMS error of every quantized tensor, the worst -worst
// listed) to stdout. Output is written to a temporary directory beside -out
// and renamed at the end; an interrupted (SIGINT, SIGTERM) or failed run
// leaves no -out directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights/convert"
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
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = "usage: convert -in DIR -out DIR [-exclude PATTERNS] [-shard-size MB] [-workers N] [-worst N] [-quiet]"

// run converts as the arguments say, writing the report to stdout and the
// progress and errors to stderr, and returns the exit status: 0 done, 1
// failed, 2 bad arguments.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "input checkpoint folder (Hugging Face layout)")
	out := fs.String("out", "", "output folder (must not exist; outside -in)")
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
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if *shardMB <= 0 {
		fmt.Fprintln(stderr, "convert: -shard-size must be positive")
		return 2
	}
	if *workers < 0 || *worst < 0 {
		fmt.Fprintln(stderr, "convert: -workers and -worst must not be negative")
		return 2
	}
	// A file given as -in would otherwise be taken for a file of its
	// folder, and the error would be about that folder.
	if fi, err := os.Stat(*in); err == nil && !fi.IsDir() {
		fmt.Fprintf(stderr, "convert: -in %s is a file: the input must be a checkpoint folder (config.json, *.safetensors)\n", *in)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := convert.Options{In: *in, Out: *out, Exclude: exclude, ShardBytes: *shardMB * 1e6, Workers: *workers, Check: checkLoads}
	if !*quiet {
		opts.Progress = stderr
		if f, ok := stderr.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				opts.ProgressTTY = true
			}
		}
	}
	rep, err := convert.Convert(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	rep.Write(stdout, *worst)
	return 0
}

// checkLoads builds the converted folder dir on the CPU as engine.Load
// would, so that a checkpoint whose tensors disagree with its config fails
// here, naming the tensor and the field, rather than later in generate. The
// weights stay mapped (the CPU backend uses NVFP4 and bf16 in place), so the
// check reads little. Architectures the engine does not run are converted
// unchecked.
func checkLoads(dir string) error {
	f, err := model.ReadFolder(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if !slices.Contains(model.Supported(), f.Config.ModelType) {
		return nil
	}
	_, err = model.Build(cpu.New(1), f, model.Options{})
	return err
}
