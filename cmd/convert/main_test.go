package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

func TestRun(t *testing.T) {
	in := t.TempDir()
	l := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.BF16, Seed: 1}
	if err := l.Write(in); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"no args", nil, 2},
		{"no -out", []string{"-in", in}, 2},
		{"extra arg", []string{"-in", in, "-out", out, "x"}, 2},
		{"bad shard size", []string{"-in", in, "-out", out, "-shard-size", "0"}, 2},
		{"negative workers", []string{"-in", in, "-out", out, "-workers", "-1"}, 2},
		{"unknown flag", []string{"-in", in, "-out", out, "-fast"}, 2},
		{"missing input", []string{"-in", filepath.Join(in, "nope"), "-out", out, "-quiet"}, 1},
		{"ok", []string{"-in", in, "-out", out, "-quiet", "-worst", "2", "-exclude", "lm_head"}, 0},
		{"output exists", []string{"-in", in, "-out", out, "-quiet"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := run(tc.args); got != tc.want {
				t.Errorf("run(%q) = %d, want %d", tc.args, got, tc.want)
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
