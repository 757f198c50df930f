package testmodel_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// TestShapes checks the registry: every shape named, described on one line,
// with a valid config; an unknown name lists the known ones.
func TestShapes(t *testing.T) {
	names := testmodel.ShapeNames()
	for _, want := range []string{"deepseek-v4-bench", "deepseek-v4-flash", "deepseek-v4-flash-32e", "deepseek-v4-flash-nvfp4", "llama3-8b", "llama3.2-1b", "qwen3-8b", "qwen3-8b-2l-bf16", "tiny-llama"} {
		s, err := testmodel.Shape(want)
		if err != nil {
			t.Errorf("Shape(%q): %v", want, err)
			continue
		}
		if s.Name != want || s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("Shape(%q): name %q, description %q", want, s.Name, s.Description)
		}
		if _, err := s.Config(); err != nil {
			t.Errorf("%s: Config: %v", want, err)
		}
		if s.WeightBytes() <= 0 || s.CheckpointBytes() < s.WeightBytes() {
			t.Errorf("%s: WeightBytes %d, CheckpointBytes %d", want, s.WeightBytes(), s.CheckpointBytes())
		}
	}
	if len(testmodel.Shapes()) != len(names) {
		t.Errorf("Shapes lists %d, ShapeNames %d", len(testmodel.Shapes()), len(names))
	}
	if s, _ := testmodel.Shape("deepseek-v4-bench"); !reflect.DeepEqual(s.Model, testmodel.DeepseekV4{Experts: 32, Seed: 1}) {
		t.Errorf("deepseek-v4-bench is %+v, not engine's BenchmarkDecodeDeepseekV4 model", s.Model)
	}
	_, err := testmodel.Shape("nope")
	if err == nil || !strings.Contains(err.Error(), strings.Join(names, ", ")) {
		t.Errorf("Shape(nope): %v, want the known names listed", err)
	}
}

// TestLlamaBytes checks Llama.CheckpointBytes against the written file, and
// WeightBytes against its linears and LM head, NVFP4 and not.
func TestLlamaBytes(t *testing.T) {
	tiny, _ := testmodel.Shape("tiny-llama")
	for _, l := range []testmodel.Llama{
		tiny.Model.(testmodel.Llama),
		{Layers: 2, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, HeadDim: 32, Vocab: 40, Qwen3: true, DType: weights.F32, Seed: 2},
	} {
		dir := t.TempDir()
		if err := l.Write(dir); err != nil {
			t.Fatal(err)
		}
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		var all, read int64
		for _, name := range ck.Names() {
			tn, _ := ck.Tensor(name)
			all += int64(len(tn.Data))
			if len(tn.Shape) >= 2 && name != "model.embed_tokens.weight" {
				read += int64(len(tn.Data))
			}
		}
		ck.Close()
		if got := l.CheckpointBytes(); got != all {
			t.Errorf("%+v: CheckpointBytes %d, the file holds %d", l, got, all)
		}
		if got := l.WeightBytes(); got != read {
			t.Errorf("%+v: WeightBytes %d, the linears and LM head hold %d", l, got, read)
		}
	}
}

// TestSpecWritten checks the stamp: a written shape is recognized, another
// shape or seed is not, and a write stopped by its progress function leaves
// neither config.json nor a complete stamp.
func TestSpecWritten(t *testing.T) {
	s, _ := testmodel.Shape("tiny-llama")
	dir := t.TempDir()
	if s.Written(dir) {
		t.Fatal("an empty folder holds tiny-llama")
	}
	var calls int
	var last [2]int64
	if err := s.WriteProgress(dir, func(done, total int64) error { calls++; last = [2]int64{done, total}; return nil }); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last[0] != last[1] || last[1] != s.CheckpointBytes() {
		t.Errorf("%d progress calls, the last %v, want it at %d of %d", calls, last, s.CheckpointBytes(), s.CheckpointBytes())
	}
	if !s.Written(dir) {
		t.Error("Written is false after Write")
	}
	other := s
	l := other.Model.(testmodel.Llama)
	l.Seed++
	other.Model = l
	if other.Written(dir) {
		t.Error("a folder of seed 1 holds seed 2")
	}
	if big, _ := testmodel.Shape("llama3-8b"); big.Written(dir) {
		t.Error("tiny-llama's folder holds llama3-8b")
	}

	stop := errors.New("stop")
	if err := s.WriteProgress(dir, func(done, total int64) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("stopped write: %v, want the progress function's error", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stopped write left config.json (%v)", err)
	}
	if s.Written(dir) {
		t.Error("Written is true after a stopped write")
	}
	if b, err := os.ReadFile(filepath.Join(dir, testmodel.StampFile)); err != nil || !strings.Contains(string(b), `"complete": false`) {
		t.Errorf("stamp after a stopped write: %s (%v)", b, err)
	}
}
