// Command bench is Manifold's llama-bench: it measures a model's prompt
// processing and decode rates through the public engine API and sets the
// decode rate against the memory floor of the device it runs on.
//
//	go run ./cmd/bench -model DIR [-p 512] [-n 128] [-device auto|cpu|cuda] [-threads N] [-r 3] [-o text|json]
//	go run ./cmd/bench -random NAME [-layers N] [-keep DIR] ...
//
// -model names a model folder (config.json and a safetensors checkpoint).
// -random NAME instead writes a random checkpoint of a named real shape
// (internal/testmodel: llama3-8b, llama3.2-1b, qwen3-8b, qwen3-8b-2l-bf16,
// deepseek-v4-bench, tiny-llama) and benchmarks it: into a temporary folder
// removed at exit, or into -keep DIR, which is reused when it already holds
// that checkpoint (a folder holding anything else is refused, one holding
// an older random checkpoint is overwritten). Writing a multi-GB checkpoint
// reports its progress on stderr. -layers N cuts the named shape to its
// first N decoder layers (testmodel.Spec.WithLayers, named NAME-Nl): a few
// layers of a checkpoint the disk or the GPU cannot hold whole, such as
// deepseek-v4-flash (156 GB; about 3.6 GB a layer), measured at the real
// per-layer shapes, its floor counting the bytes of the layers written.
//
// Tests, each repeated -r times after a warm-up run (-warmup=false skips it),
// the median reported with the sample standard deviation (JSON also gives
// every sample and the best):
//
//   - ppP: prompt processing. A P-token prompt appended to an empty session
//     (engine.Session.Append, the last token's logits read back), P tokens
//     over the wall time.
//   - tgN: decode. After the same P-token prompt (one token when -p 0), N
//     tokens generated greedily one at a time by engine.Session.Generate (the
//     engine's own loop: on the GPU, each pick's run queued ahead), N over the
//     time of their N one-token forward passes (Result.DecodeDuration: the
//     token the prompt's pass picks is not counted).
//
// The decode row also gives the memory floor. Bytes per decoded token is
// what one decode step must read:
//
//   - the weights: every tensor of the checkpoint of rank 2 or more, in its
//     stored format (the linears, with an NVFP4 linear's packed codes and
//     block scales; the LM head; routers, mHC matrices and the like),
//     except integer tensors (routing tables such as tid2eid, read on the
//     host) and the embedding table, of which one row is counted (the whole
//     table as well when the LM head is tied to it); routed experts
//     (".experts.E." in the name) count num_experts_per_tok of
//     n_routed_experts (or num_experts) of them. Norm weights, biases and
//     scalars (NVFP4 global scales) are left out: under 0.1% of the real
//     shapes of testmodel. For its Llama shapes this is
//     testmodel.Llama.WeightBytes plus one embedding row;
//   - the KV cache read at the mean context of the decode: the session's
//     cache bytes per position (engine.Session.CacheBytesPerToken) times the
//     mean number of positions the N steps attend to, P + (N+1)/2. Dense
//     attention reads all of it; for compressed or sparse attention
//     (DeepSeek-V4) it is the cache's growth per position, an estimate.
//
// The copy bandwidth is measured as the existing benchmarks measure it
// (kernels.Backend.CopyBandwidth, backend/cpu's BenchmarkCopy), counting
// bytes read plus bytes written per second: on the GPU the driver's
// device-to-device copy of a -copy-mib buffer (1 GiB by default) into
// another, 20 times between CUDA events (kernels.Backend.MeasureCopyBandwidth);
// on the CPU every thread copying its share of such a buffer, the best of 5.
// The floor is copy bandwidth / bytes per token, in tokens per second, as
// the engine's GPU decode benchmarks compute it (timeDecode, of
// engine/gpu_bench_test.go): the bytes a step reads, counted once, over a
// rate that counts each copied byte twice (read and written). "of floor" is
// the decode rate over the floor.
//
// Output: a llama-bench-like markdown table on stdout (model, type, size,
// device, test, t/s as median ± standard deviation, bytes per token, floor
// t/s, share of the floor), after lines giving the load time, the copy
// bandwidth and the parts of the bytes per token; -o json prints a JSON
// array with one object per test instead. Progress and notes go to stderr.
// Ctrl-C stops cleanly (a random checkpoint being written into a temporary
// folder is removed).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/manifoldlm/manifold/internal/testmodel"
)

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err = run(ctx, o, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench: interrupted")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the flags.
type options struct {
	model, random, keep string
	prompt, gen         int // -p, -n
	device              string
	threads             int
	reps                int
	output              string
	copyBytes           int // -copy-mib in bytes
	layers              int // -layers: the -random shape cut to this many layers (0: as named)
	warmup              bool
	profile             bool
	noCuBLAS            bool // -no-cublas
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var copyMiB int
	fs.StringVar(&o.model, "model", "", "model folder (config.json, *.safetensors)")
	fs.StringVar(&o.random, "random", "", "benchmark a random checkpoint of this named shape instead: "+strings.Join(testmodel.ShapeNames(), ", "))
	fs.IntVar(&o.layers, "layers", 0, "with -random: the shape with this many decoder layers (0: all), e.g. a few of deepseek-v4-flash's 43 where the disk or GPU cannot hold them")
	fs.StringVar(&o.keep, "keep", "", "with -random: write the checkpoint into this folder and keep it (reused when it holds it already)")
	fs.IntVar(&o.prompt, "p", 512, "prompt tokens of the ppP test (0: no pp test; tg then starts after one token)")
	fs.IntVar(&o.gen, "n", 128, "tokens of the tgN decode test (0: no tg test)")
	fs.StringVar(&o.device, "device", "auto", "auto, cpu or cuda")
	fs.IntVar(&o.threads, "threads", 0, "CPU threads (0: all cores)")
	fs.IntVar(&o.reps, "r", 3, "repetitions of each test (the median is reported)")
	fs.StringVar(&o.output, "o", "text", "output format: text (a table) or json")
	fs.IntVar(&copyMiB, "copy-mib", 1024, "MiB of the buffer the copy bandwidth is measured on")
	fs.BoolVar(&o.warmup, "warmup", true, "run each test once, untimed, before its repetitions")
	fs.BoolVar(&o.noCuBLAS, "no-cublas", false, "GPU: every matmul on Manifold's own kernels (the default takes prefill matmuls to cuBLAS where libcublas loads; the device line says which)")
	fs.BoolVar(&o.profile, "profile", false, "GPU: after the tests, print the device time of each kernel over 8 decode steps (launched one by one) to stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: bench -model DIR | -random NAME [-keep DIR] [flags]\n\nflags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nshapes for -random:\n%s", shapeList())
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	o.copyBytes = copyMiB << 20
	if copyMiB <= 0 || copyMiB > 1<<20 {
		return nil, fmt.Errorf("-copy-mib %d: want 1 to %d", copyMiB, 1<<20)
	}
	return o, o.check()
}

// check validates what can be checked before the model is read.
func (o *options) check() error {
	switch {
	case o.model == "" && o.random == "":
		return errors.New("give a model folder (-model DIR) or a shape to write at random (-random NAME)")
	case o.model != "" && o.random != "":
		return errors.New("-model and -random both given: choose one")
	case o.keep != "" && o.random == "":
		return errors.New("-keep needs -random (it names the folder the random checkpoint is written into)")
	case o.layers != 0 && o.random == "":
		return errors.New("-layers needs -random (it cuts the named shape)")
	case o.layers < 0:
		return fmt.Errorf("-layers %d: want >= 1 (0: the shape's own)", o.layers)
	case o.prompt < 0:
		return fmt.Errorf("-p %d: want >= 0", o.prompt)
	case o.gen < 0:
		return fmt.Errorf("-n %d: want >= 0", o.gen)
	case o.prompt == 0 && o.gen == 0:
		return errors.New("-p 0 and -n 0: nothing to measure")
	case o.reps < 1:
		return fmt.Errorf("-r %d: want at least 1 repetition", o.reps)
	case o.threads < 0:
		return fmt.Errorf("-threads %d: want >= 0 (0: all cores)", o.threads)
	case o.copyBytes <= 0:
		return fmt.Errorf("copy buffer of %d bytes: want > 0", o.copyBytes)
	}
	switch o.device {
	case "auto", "cpu", "cuda":
	default:
		return fmt.Errorf("-device %q: want auto, cpu or cuda", o.device)
	}
	switch o.output {
	case "text", "json":
	default:
		return fmt.Errorf("-o %q: want text or json", o.output)
	}
	if o.random != "" {
		if _, err := o.shape(); err != nil {
			return err
		}
	}
	return nil
}

// shape is the -random shape, cut to -layers.
func (o *options) shape() (testmodel.Spec, error) {
	spec, err := testmodel.Shape(o.random)
	if err != nil {
		return spec, fmt.Errorf("-random %q: no such shape; the shapes are:\n%s", o.random, shapeList())
	}
	if o.layers > 0 {
		if spec, err = spec.WithLayers(o.layers); err != nil {
			return spec, fmt.Errorf("-layers %d: %w", o.layers, err)
		}
	}
	return spec, nil
}

// shapeList is the named shapes, one a line with its size and description.
func shapeList() string {
	var sb strings.Builder
	for _, s := range testmodel.Shapes() {
		fmt.Fprintf(&sb, "  %-18s %10s  %s\n", s.Name, formatBytes(float64(s.CheckpointBytes())), s.Description)
	}
	return sb.String()
}
