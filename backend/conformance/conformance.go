// Package conformance is Manifold's test-backend-ops: a table of ops, each
// at several shapes (including sizes that are not multiples of any kernel's
// tile) with a tolerance, run on a backend and compared with the plain
// reference math of package layers (and float64 sums). Every backend's
// tests run it: backend/cpu's in `go test ./...`, the CUDA backend's
// (kernels) on a GPU machine through kernels/gpu.sh, once per kernel
// variant a default path can choose.
//
// A row of the table is a Case; Run runs them all as subtests.
package conformance

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
)

// Case is one op at one shape.
type Case struct {
	Op    string  // the backend method (or op group and method)
	Shape string  // the shape, for the subtest's name
	Tol   float64 // max |got - want| / max(1, max |want|)
	// Q8Tol, where not 0, is Tol for a backend whose NVFP4 kernels round x
	// to 8 bits (RunQ8: backend/cpu's default kernels).
	Q8Tol float64
	// Run computes the op on b and by the reference from the same seeded
	// inputs and returns both. Needs names the op group it requires (""
	// for the core Backend); backends without it skip the case.
	Run   func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) (got, want []float32)
	Needs string
}

// Name is the subtest name: op/shape.
func (c Case) Name() string { return c.Op + "/" + c.Shape }

// Run runs every case of Cases on b as a subtest of t.
func Run(t *testing.T, b backend.Backend) { run(t, b, false) }

// RunQ8 is Run for a backend whose NVFP4 kernels take x in 8 bits (int8
// per block, as llama.cpp's Q8 activations): the cases' Q8Tol apply.
func RunQ8(t *testing.T, b backend.Backend) { run(t, b, true) }

func run(t *testing.T, b backend.Backend, q8 bool) {
	caps := backend.CapabilitiesOf(b)
	for _, c := range Cases() {
		t.Run(c.Name(), func(t *testing.T) {
			if !has(caps, c.Needs) && !holds(b, c.Needs) {
				t.Skipf("backend %s lacks %s", b.Name(), c.Needs)
			}
			rng := rand.New(rand.NewPCG(uint64(len(c.Op)), uint64(len(c.Shape))))
			got, want := c.Run(b, caps, rng)
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			tol := c.Tol
			if q8 && c.Q8Tol != 0 {
				tol = c.Q8Tol
			}
			if err := Compare(got, want, tol); err != nil {
				t.Error(err)
			}
		})
	}
}

// Compare checks got against want: same length, no NaN where want has
// none, max |got - want| <= tol * max(1, max |want|).
func Compare(got, want []float32, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	scale, d, at := 1.0, 0.0, -1
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	for i := range got {
		e := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(e) && !math.IsNaN(float64(want[i])) {
			return fmt.Errorf("value %d is %v, want %v", i, got[i], want[i])
		}
		if e > d {
			d, at = e, i
		}
	}
	if d > tol*scale {
		return fmt.Errorf("max |got - want| %.3g at %d (got %v, want %v) > %.3g × %.3g", d, at, got[at], want[at], tol, scale)
	}
	return nil
}

func has(c backend.Capabilities, group string) bool {
	switch group {
	case "":
		return true
	case "SparseMLAOps":
		return c.SparseMLA != nil
	case "CompressedAttentionOps":
		return c.Compressed != nil
	case "HyperConnectionOps":
		return c.HyperConnection != nil
	case "TreeAttentionOps":
		return c.TreeAttention != nil
	case "PagedAttentionOps":
		return c.Paged != nil
	case "BatchTokenSampler":
		return c.BatchSampler != nil
	case "TokenSampler":
		return c.Sampler != nil
	}
	return false
}

// holds reports whether b uploads weights of the format named by needs
// ("format:fp8block"): a tiny weight is tried, and an error wrapping
// backend.ErrUnsupportedFormat means not yet.
func holds(b backend.Backend, needs string) bool {
	name, ok := strings.CutPrefix(needs, "format:")
	if !ok {
		return false
	}
	for f := range backend.Format(255) {
		if f.String() == name {
			_, hw := weight(rand.New(rand.NewPCG(1, 1)), f, 1, 32)
			_, err := b.Upload(hw)
			return !errors.Is(err, backend.ErrUnsupportedFormat)
		}
	}
	return false
}

// rows makes a Case of each spec of a table by one constructor.
func rows[S any](specs []S, row func(S) Case) []Case {
	cs := make([]Case, 0, len(specs))
	for _, s := range specs {
		cs = append(cs, row(s))
	}
	return cs
}

// must returns v, or panics with err: a Case's setup (an upload, a
// reference's constructor) has no error to return.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// formatName names f in a shape: fp8BlockF32 as "fp8block-f32".
func formatName(f backend.Format) string {
	if f == fp8BlockF32 {
		return "fp8block-f32"
	}
	return f.String()
}

// rnd returns n values of a normal distribution times scale.
func rnd(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// upload puts host values on b.
func upload(b backend.Backend, v []float32) backend.Buffer {
	x := b.NewBuffer(len(v))
	b.Write(x, 0, v)
	return x
}

// read reads a buffer back.
func read(b backend.Backend, x backend.Buffer) []float32 {
	v := make([]float32, x.Len())
	b.Read(v, x, 0)
	return v
}
