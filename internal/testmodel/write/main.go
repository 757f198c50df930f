// Command write writes a random checkpoint of a named shape (testmodel.Shape)
// into a folder: the weights that fixture scripts hand to transformers.
//
//	go run ./internal/testmodel/write -shape qwen3-8b-2l-bf16 [-layers N] -out DIR
//
// -layers N cuts the shape to its first N decoder layers
// (testmodel.Spec.WithLayers).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/manifoldlm/manifold/internal/testmodel"
)

func main() {
	shape := flag.String("shape", "", "shape name: "+strings.Join(testmodel.ShapeNames(), ", "))
	out := flag.String("out", "", "folder to write config.json and model.safetensors into (created)")
	layers := flag.Int("layers", 0, "the shape cut to this many decoder layers (0: all)")
	flag.Parse()
	if err := run(*shape, *out, *layers); err != nil {
		fmt.Fprintln(os.Stderr, "write:", err)
		os.Exit(1)
	}
}

func run(name, out string, layers int) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	s, err := testmodel.Shape(name)
	if err != nil {
		return err
	}
	if layers > 0 {
		if s, err = s.WithLayers(layers); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return s.Write(out)
}
