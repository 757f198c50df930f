package stcompare

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/manifoldlm/manifold/weights"
	"github.com/nlpodyssey/safetensors"
)

// writeFile writes n BF16 tensors of elems elements with weights.Writer.
func writeFile(b *testing.B, n, elems int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "x.safetensors")
	w, err := weights.Create(path, map[string]string{"format": "pt"})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 2*elems)
	for i := range n {
		if err := w.Add(fmt.Sprintf("model.layers.%d.self_attn.q_proj.weight", i), weights.BF16, []int{elems}, data); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// openNLP maps the file and hands it to nlpodyssey/safetensors, which
// parses a byte slice and does no I/O of its own.
func openNLP(path string) (safetensors.SafeTensors, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return safetensors.SafeTensors{}, nil, err
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return safetensors.SafeTensors{}, nil, err
	}
	s, err := safetensors.Deserialize(m)
	return s, m, err
}

// BenchmarkOpen: map the file, parse and validate the header, look one tensor
// up, unmap.
func BenchmarkOpen(b *testing.B) {
	for _, n := range []int{100, 2000} {
		path := writeFile(b, n, 16)
		name := "model.layers.7.self_attn.q_proj.weight"
		b.Run(fmt.Sprintf("tensors=%d/weights", n), func(b *testing.B) {
			for b.Loop() {
				c, err := weights.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Tensor(name); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
		b.Run(fmt.Sprintf("tensors=%d/nlpodyssey", n), func(b *testing.B) {
			for b.Loop() {
				s, m, err := openNLP(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, ok := s.Tensor(name); !ok {
					b.Fatal("missing")
				}
				syscall.Munmap(m)
			}
		})
	}
}

// TestCapabilities records what nlpodyssey/safetensors does with inputs
// weights must handle.
func TestCapabilities(t *testing.T) {
	if _, err := safetensors.ParseDType("F8_E4M3"); err == nil {
		t.Log("nlpodyssey parses F8_E4M3")
	} else {
		t.Logf("nlpodyssey: F8_E4M3: %v", err)
	}
	// The same name twice in one header.
	hdr := `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`
	buf := append(make([]byte, 8), hdr...)
	buf[0] = byte(len(hdr))
	buf = append(buf, 1)
	if _, err := safetensors.Deserialize(buf); err != nil {
		t.Logf("nlpodyssey: duplicate names: %v", err)
	} else {
		t.Log("nlpodyssey: duplicate names accepted silently")
	}
}
