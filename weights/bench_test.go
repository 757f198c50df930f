package weights

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// writeBenchCheckpoint writes a checkpoint of n BF16 tensors of elems
// elements each and returns its path and size in bytes.
func writeBenchCheckpoint(b *testing.B, n, elems int) (string, int64) {
	b.Helper()
	path := filepath.Join(b.TempDir(), "bench.safetensors")
	w, err := Create(path, map[string]string{"format": "pt"})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 2*elems)
	for i := range data {
		data[i] = byte(i * 131)
	}
	for i := range n {
		if err := w.Add(fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", i), BF16, []int{elems}, data); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return path, st.Size()
}

// BenchmarkOpen measures Open+Close of a file with many small tensors: the
// cost of mapping and validating the header.
func BenchmarkOpen(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("tensors=%d", n), func(b *testing.B) {
			path, _ := writeBenchCheckpoint(b, n, 16)
			for b.Loop() {
				c, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkOpenReadAll opens a 64 MiB BF16 checkpoint (in the page cache)
// and converts every tensor to float32. Throughput is of stored bytes.
func BenchmarkOpenReadAll(b *testing.B) {
	path, size := writeBenchCheckpoint(b, 32, 1<<20)
	b.SetBytes(size)
	for b.Loop() {
		readAll(b, path)
	}
}

// readAll opens the checkpoint at path, converts every tensor to float32
// and closes it.
func readAll(b *testing.B, path string) {
	c, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, name := range c.Names() {
		t, err := c.Tensor(name)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := t.Float32(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenReadAllGolden opens the golden llama checkpoint (float32) and
// reads every tensor.
func BenchmarkOpenReadAllGolden(b *testing.B) {
	dir := filepath.Join(goldenDir(b), "llama")
	for b.Loop() {
		readAll(b, dir)
	}
}

// BenchmarkShardedWriter writes 64 MiB as 4 shards of 16 MiB.
func BenchmarkShardedWriter(b *testing.B) {
	data := make([]byte, 2<<20)
	b.SetBytes(32 * int64(len(data)))
	for b.Loop() {
		s := NewShardedWriter(b.TempDir(), 16<<20, nil)
		for i := range 32 {
			if err := s.Add(fmt.Sprintf("t%d", i), BF16, []int{1 << 20}, data); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenCopy compares opening a 256 MiB checkpoint (in the page
// cache) mapped, the default, and copied (OpenOptions.Copy): the open
// alone, and the open followed by a read of one byte in every 4 KiB page of
// every tensor, which a mapping pays in page faults on first use (as a
// model's first forward pass does). Throughput is of file bytes.
func BenchmarkOpenCopy(b *testing.B) {
	path, size := writeBenchCheckpoint(b, 128, 1<<20)
	for _, copied := range []bool{false, true} {
		for _, touch := range []bool{false, true} {
			name := map[bool]string{false: "mmap", true: "copy"}[copied] + map[bool]string{false: "/open", true: "/open+touch"}[touch]
			b.Run(name, func(b *testing.B) {
				b.SetBytes(size)
				var sum byte
				for b.Loop() {
					c, err := OpenWith(path, OpenOptions{Copy: copied})
					if err != nil {
						b.Fatal(err)
					}
					if touch {
						for _, n := range c.Names() {
							t, _ := c.Tensor(n)
							for i := 0; i < len(t.Data); i += 4096 {
								sum += t.Data[i]
							}
						}
					}
					c.Close()
				}
				_ = sum
			})
		}
	}
}
