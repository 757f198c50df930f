package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// tinyLlama is the checkpoint the tests convert.
var tinyLlama = testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.BF16, Seed: 1}

func TestRun(t *testing.T) {
	in := testmodel.WriteTemp(t, tinyLlama)
	out := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		name string
		args []string
		want int
		msg  string // in stderr
	}{
		{"no args", nil, 2, "usage: convert"},
		{"no -out", []string{"-in", in}, 2, ""},
		{"extra arg", []string{"-in", in, "-out", out, "x"}, 2, "usage: convert"},
		{"bad shard size", []string{"-in", in, "-out", out, "-shard-size", "0"}, 2, ""},
		{"negative workers", []string{"-in", in, "-out", out, "-workers", "-1"}, 2, ""},
		{"unknown flag", []string{"-in", in, "-out", out, "-fast"}, 2, ""},
		{"missing input", []string{"-in", filepath.Join(in, "nope"), "-out", out, "-quiet"}, 1, ""},
		{"input is a file", []string{"-in", filepath.Join(in, "config.json"), "-out", out, "-quiet"}, 2, "is a file: the input must be a checkpoint folder"},
		{"ok", []string{"-in", in, "-out", out, "-quiet", "-worst", "2", "-exclude", "lm_head"}, 0, ""},
		{"output exists", []string{"-in", in, "-out", out, "-quiet"}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := run(tc.args, &stdout, &stderr); got != tc.want || !strings.Contains(stderr.String(), tc.msg) {
				t.Errorf("run(%q) = %d, stderr %q; want %d, stderr with %q", tc.args, got, stderr.String(), tc.want, tc.msg)
			}
			if tc.want == 0 && !strings.Contains(stdout.String(), "accuracy (relative RMS error") {
				t.Errorf("run(%q): stdout %q lacks the accuracy report", tc.args, stdout.String())
			}
		})
	}
	cfg, err := nvfp4ckpt.ReadConfig(out)
	if err != nil || cfg == nil || !cfg.IsQuantized("model.layers.0.mlp.up_proj") || cfg.IsQuantized("lm_head") {
		t.Errorf("converted config %+v, %v", cfg, err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err != nil {
		t.Error(err)
	}
}

// TestShapesDisagreeWithConfig: a checkpoint whose tensors do not match its
// config.json (intermediate_size edited) fails at conversion, naming the
// tensor, and publishes nothing, instead of converting and failing later in
// generate.
func TestShapesDisagreeWithConfig(t *testing.T) {
	in := testmodel.WriteTemp(t, tinyLlama)
	path := filepath.Join(in, "config.json")
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Replace(cfg, []byte(`"intermediate_size": 48`), []byte(`"intermediate_size": 64`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	var stdout, stderr bytes.Buffer
	if got := run([]string{"-in", in, "-out", out, "-quiet"}, &stdout, &stderr); got != 1 || !strings.Contains(stderr.String(), "would not load") || !strings.Contains(stderr.String(), "mlp.gate_proj") {
		t.Errorf("run = %d, stderr %q: want 1 and an error naming the mismatched tensor", got, stderr.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output %s published (stat: %v)", out, err)
	}
}
