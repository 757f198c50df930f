// Package layering states the import rules of the module, which its test
// enforces: every package sits on a layer, and a package imports only
// packages of lower layers or of its own folder tree. From the bottom:
//
//	0  quant (number formats), layers (reference math), tokenizer, internal/defaultmodel,
//	   internal/testimage (a test-built kernel image, set only by tests),
//	   internal/testnum (random inputs and error measures for tests),
//	   internal/testproc (child processes for tests), internal/kvpage (paged KV cache blocks)
//	1  weights (safetensors; weights/nvfp4ckpt and weights/convert, the quantized layouts)
//	2  backend (the compute contract; backend/cpu), internal/golden, internal/testmodel,
//	   internal/serveload (a load-test client of cmd/serve)
//	3  kernels (the CUDA backend), model (the architectures): neither imports the other
//	4  engine (the public API)
//	5  cmd/..., training/..., internal/modeltest (test helpers that open model folders through the engine)
//	6  dev/... (the workbench): no production package imports it
//
// Files built only with the manifold_dev tag belong to the workbench too.
package layering

// Layers maps the first folder of a package's path (or a longer prefix,
// which wins) to its layer.
var Layers = map[string]int{
	"quant":                 0,
	"layers":                0,
	"tokenizer":             0,
	"internal/defaultmodel": 0,
	"internal/testimage":    0,
	"internal/testnum":      0,
	"internal/testproc":     0,
	"internal/kvpage":       0,
	"weights":               1,
	"backend":               2,
	"internal/golden":       2,
	"internal/testmodel":    2,
	"internal/serveload":    2,
	"internal/layering":     2,
	"kernels":               3,
	"model":                 3,
	"engine":                4,
	"cmd":                   5,
	"training":              5,
	"internal/modeltest":    5,
	"dev":                   6,
}

// Of returns the layer of a package path relative to the module root and
// the prefix that placed it; ok is false for a path no prefix covers.
func Of(rel string) (layer int, prefix string, ok bool) {
	for p, l := range Layers {
		if (rel == p || len(rel) > len(p) && rel[:len(p)] == p && rel[len(p)] == '/') && len(p) > len(prefix) {
			layer, prefix, ok = l, p, true
		}
	}
	return layer, prefix, ok
}
