package weights_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/manifoldlm/manifold/weights"
)

// Write a safetensors file, then open it and read a tensor back.
func Example() {
	dir, err := os.MkdirTemp("", "weights-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.safetensors")

	w, err := weights.Create(path, map[string]string{"format": "pt"})
	if err != nil {
		fmt.Println(err)
		return
	}
	data := make([]byte, 4*6)
	for i := range 6 {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i)/2))
	}
	if err := w.Add("layer.weight", weights.F32, []int{2, 3}, data); err != nil {
		fmt.Println(err)
		return
	}
	if err := w.Close(); err != nil {
		fmt.Println(err)
		return
	}

	c, err := weights.Open(dir) // a file, a folder, or a sharded index
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	t, err := c.Tensor("layer.weight")
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := t.Float32() // any of the float dtypes, converted
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Names(), t.Shape, v)
	// Output: [layer.weight] [2 3] [0 0.5 1 1.5 2 2.5]
}
