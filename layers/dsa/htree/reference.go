package htree

import (
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/layers"
)

// BuildLevels builds the tree's levels from scratch, level by level: level 0
// is keys and values ([n, kvHeads, headDim]) and level l's node i is the mean
// of nodes [i·rate, min(i·rate+rate, nodes of l-1)) of level l-1. It is the
// reference for Tree.Append.
func BuildLevels(keys, values []float32, n, kvHeads, headDim, rate, levels int) (k, v [][]float32) {
	row := kvHeads * headDim
	k = [][]float32{keys[:n*row]}
	v = [][]float32{values[:n*row]}
	for l := 1; l < levels; l++ {
		children := len(k[l-1]) / row
		nodes := (children + rate - 1) / rate
		pk, pv := make([]float32, nodes*row), make([]float32, nodes*row)
		for i := range nodes {
			c1 := min(i*rate+rate, children)
			for _, kv := range [][2][]float32{{pk, k[l-1]}, {pv, v[l-1]}} {
				dst := kv[0][i*row : (i+1)*row]
				for c := i * rate; c < c1; c++ {
					src := kv[1][c*row : (c+1)*row]
					for j := range dst {
						if c == i*rate {
							dst[j] = src[j]
						} else {
							dst[j] += src[j]
						}
					}
				}
				if cnt := c1 - i*rate; cnt > 1 {
					for j := range dst {
						dst[j] /= float32(cnt)
					}
				}
			}
		}
		k, v = append(k, pk), append(v, pv)
	}
	return k, v
}

// Reference computes htree attention the plain way (docs/htree.md, steps
// 1-7): it builds the tree of keys and values ([n, KVHeads, HeadDim], keys
// before RoPE) from scratch and, for each of the m queries at positions
// pos0.. (q [m, Heads, HeadDim], before RoPE; pos0+m <= n), rotates every
// candidate key explicitly, materializes every score of a level in float64,
// selects by sorting, collects every term and takes one float64 softmax at
// the end. out is [m, Heads, HeadDim].
func Reference(out, q, keys, values []float32, n, pos0, m int, s layers.AttentionShape, rope *layers.RoPE, o Options) error {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	if pos0 < 0 || m < 0 || pos0+m > n {
		return fmt.Errorf("htree: reference queries [%d, %d) over %d positions", pos0, pos0+m, n)
	}
	if s.Heads <= 0 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 || rope.Dim() > s.HeadDim {
		return fmt.Errorf("htree: reference shape %+v with %d rotary channels", s, rope.Dim())
	}
	hd, r := s.HeadDim, o.Rate
	row := s.KVHeads * hd
	lk, lv := BuildLevels(keys, values, n, s.KVHeads, hd, r, o.Levels(n))
	half := len(rope.InvFreq)
	cos, sin := make([]float32, half), make([]float32, half)
	rotated := func(v []float32, pos int) []float32 {
		x := slices.Clone(v)
		layers.RoPEAngles(cos, sin, pos, rope, false)
		layers.RotatePairs(x, cos, sin, rope.Interleaved)
		return x
	}
	type term struct {
		score float64
		value []float32
	}
	for i := range m {
		t := pos0 + i
		top := o.TopLevel(t)
		for h := range s.Heads {
			kh := h / (s.Heads / s.KVHeads)
			var terms []term
			var parents []int
			for lev := top; lev >= 0; lev-- {
				rho := t / int(math.Pow(float64(r), float64(lev)))
				var cands []int
				for c := 0; c <= rho; c++ {
					if lev == top || slices.Contains(parents, c/r) {
						cands = append(cands, c)
					}
				}
				nc := len(cands)
				qr := rotated(q[(i*s.Heads+h)*hd:(i*s.Heads+h+1)*hd], nc-1)
				scores := make([]float64, nc)
				for ci, c := range cands {
					kr := rotated(lk[lev][c*row+kh*hd:c*row+(kh+1)*hd], ci)
					var d float64
					for j := range qr {
						d += float64(qr[j]) * float64(kr[j])
					}
					scores[ci] = d * float64(s.Scale)
				}
				selected := make([]bool, nc)
				if lev > 0 {
					order := make([]int, nc)
					for ci := range order {
						order[ci] = ci
					}
					slices.SortFunc(order, func(a, b int) int {
						switch {
						case a == b:
							return 0
						case cands[a] == rho:
							return -1
						case cands[b] == rho:
							return 1
						case scores[a] > scores[b]:
							return -1
						case scores[a] < scores[b]:
							return 1
						}
						return cands[a] - cands[b]
					})
					parents = parents[:0]
					for _, ci := range order[:min(o.TopK, nc)] {
						selected[ci] = true
						parents = append(parents, cands[ci])
					}
				}
				for ci, c := range cands {
					if !selected[ci] {
						terms = append(terms, term{scores[ci], lv[lev][c*row+kh*hd : c*row+(kh+1)*hd]})
					}
				}
			}
			mx := math.Inf(-1)
			for _, tm := range terms {
				mx = max(mx, tm.score)
			}
			acc := make([]float64, hd)
			var sum float64
			for _, tm := range terms {
				w := math.Exp(tm.score - mx)
				sum += w
				for j := range acc {
					acc[j] += w * float64(tm.value[j])
				}
			}
			dst := out[(i*s.Heads+h)*hd : (i*s.Heads+h+1)*hd]
			for j := range dst {
				dst[j] = float32(acc[j] / sum)
			}
		}
	}
	return nil
}
