package conformance

import (
	"fmt"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
)

// embedCases are Embed beyond cases.go's small f32 and bf16 tables: a bf16
// table of a width off the kernel's 256 threads with a prompt's worth of
// ids (repeats, the first and last rows), and NVFP4 tables (rows decoded
// with their block and global scales). On the CUDA backend all take
// embed_ids (format 1 bf16, 2 NVFP4); the image's "embed" kernel is looked
// up at load but no Go path launches it.
func embedCases() []Case {
	return rows([]embedRow{{backend.BF16, 1000, 200, 300}, {backend.BF16, 50, 4100, 3}, {backend.NVFP4, 37, 80, 5}, {backend.NVFP4, 300, 2064, 17}}, embedCase)
}

// embedRow is n ids looked up in a vocab x cols table of format f.
type embedRow struct {
	f              backend.Format
	vocab, cols, n int
}

func embedCase(s embedRow) Case {
	return Case{Op: "Embed", Shape: fmt.Sprintf("%s/%dof%dx%d", s.f, s.n, s.vocab, s.cols), Tol: 1e-6,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			table, hw := weight(rng, s.f, s.vocab, s.cols)
			w := must(b.Upload(hw))
			ids := []int32{0, int32(s.vocab - 1)}
			for len(ids) < s.n {
				ids = append(ids, int32(rng.IntN(s.vocab)))
			}
			ids = ids[:s.n]
			want := make([]float32, 0, s.n*s.cols)
			for _, id := range ids {
				want = append(want, table[int(id)*s.cols:(int(id)+1)*s.cols]...)
			}
			dst := b.NewBuffer(s.n * s.cols)
			b.Embed(dst, w, ids)
			return read(b, dst), want
		}}
}
