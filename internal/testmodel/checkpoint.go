package testmodel

import (
	"errors"
	"os"
	"path/filepath"
	"slices"

	"github.com/manifoldlm/manifold/weights"
)

// Writing and rewriting checkpoints of tensor lists (the MoE layouts of
// moe.go) and of existing folders (tests of damaged checkpoints).

func tensorBytes(ts []v4Tensor) int64 { return countBytes(ts, nil) }

// countBytes is the bytes of the tensors counted as one of counts (all of
// them when counts is nil).
func countBytes(ts []v4Tensor, counts []v4Count) int64 {
	var n int64
	for _, t := range ts {
		if counts == nil || slices.Contains(counts, t.count) {
			n += t.bytes()
		}
	}
	return n
}

// stepBytes counts the tensors a decode step of l reads: every countAlways
// one and k of its experts routed experts a layer.
func stepBytes(l interface {
	tensors() []v4Tensor
	routed() (experts, k int)
}) int64 {
	ts := l.tensors()
	experts, k := l.routed()
	return countBytes(ts, []v4Count{countAlways}) + countBytes(ts, []v4Count{countExpert})/int64(experts)*int64(k)
}

// writeTensors writes the tensors one after the other into dir (sharded at
// v4ShardBytes), calling progress after each, then m's config.json; a
// config.json and hf_quant_config.json left from an earlier checkpoint are
// removed first, so the folder does not look whole (or quantized) while
// being rewritten.
func writeTensors(m Model, ts []v4Tensor, dir string, progress func(done, total int64) error) error {
	cfg, err := m.Config()
	if err != nil {
		return err
	}
	for _, f := range []string{"config.json", "hf_quant_config.json"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	w := weights.NewShardedWriter(dir, v4ShardBytes, map[string]string{"format": "pt"})
	total, done := tensorBytes(ts), int64(0)
	for _, t := range ts {
		data := t.make()
		if err := w.Add(t.name, t.dtype, t.shape, data); err != nil {
			return errors.Join(err, w.Close())
		}
		done += int64(len(data))
		if progress != nil {
			if err := progress(done, total); err != nil {
				return errors.Join(err, w.Close())
			}
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
}

// RewriteTensors is Rewrite where edit sees the source checkpoint (to read
// a tensor's siblings) and returns the tensors to write in the tensor's
// place: none drops it, several add some.
func RewriteTensors(src, dst string, edit func(ck *weights.Checkpoint, t *weights.Tensor) []*weights.Tensor) error {
	cfg, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), cfg, 0o644); err != nil {
		return err
	}
	ck, err := weights.Open(src)
	if err != nil {
		return err
	}
	defer ck.Close()
	w, err := weights.Create(filepath.Join(dst, "model.safetensors"), nil)
	if err != nil {
		return err
	}
	for _, name := range ck.Names() {
		t, err := ck.Tensor(name)
		if err != nil {
			return errors.Join(err, w.Close())
		}
		for _, o := range edit(ck, t) {
			if err := w.Add(o.Name, o.DType, o.Shape, o.Data); err != nil {
				return errors.Join(err, w.Close())
			}
		}
	}
	return w.Close()
}
