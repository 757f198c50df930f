package kernels

import (
	"slices"
	"testing"
)

// TestFlush: work launched by Flush (not waited for) is done before a Read
// that follows, and a Flush of an empty queue is a no-op.
func TestFlush(t *testing.T) {
	b := newGPU(t)
	b.Flush()
	src := []float32{1, 2, 3, 4}
	x, y := b.NewBuffer(4), b.NewBuffer(4)
	b.Write(x, 0, src)
	b.Scale(y, x, 2)
	b.Flush()
	b.Add(y, y, x)
	b.Flush()
	got := make([]float32, 4)
	b.Read(got, y, 0)
	if want := []float32{3, 6, 9, 12}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
}
