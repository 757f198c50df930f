package htree

import (
	"math"
	"slices"
)

// batch is the number of candidates scored between two online-softmax
// rescalings and top-K merges (seed 003's BC).
const batch = 512

// Scratch is the working memory of Attend for one goroutine.
type Scratch struct {
	cands, parents []int32
	scores         []float32
	heap           topK
	qrot, o, og    []float32
	kern           Kernels
}

// NewScratch allocates working memory for trees of options o (defaults
// filled in) and heads of headDim channels; Attend will run the inner loops
// of k.
func NewScratch(o Options, headDim int, k Kernels) *Scratch {
	o = o.WithDefaults()
	n := o.MaxCandidates()
	return &Scratch{
		cands:   make([]int32, 0, n),
		parents: make([]int32, 0, n),
		scores:  make([]float32, batch),
		heap:    make(topK, 0, o.TopK),
		qrot:    make([]float32, headDim),
		o:       make([]float32, headDim),
		og:      make([]float32, headDim),
		kern:    k.withDefaults(),
	}
}

// Attend writes into out (HeadDim values) htree attention of one query head
// q (HeadDim values, before RoPE) at position t < tr.Len() over KV head kh
// of tr, with scores scaled by scale, as seed 003's engine computes it: per
// level, one pass over the candidates in batches (scores, online softmax of
// every candidate, running top-K), then reverse subtraction of the selected
// nodes' terms and a merge into the global state; out is the global state
// normalized. ro must tabulate at least tr.Options().MaxCandidates()
// positions.
func Attend(out, q []float32, tr *Tree, ro *Rotary, t, kh int, scale float32, sc *Scratch) {
	o := tr.opts
	r, hd := o.Rate, tr.headDim
	row := tr.kvHeads * hd
	koff := kh * hd
	top := o.TopLevel(t)
	pow := 1
	for range top {
		pow *= r
	}
	inf := float32(math.Inf(1))
	gm, gl := float32(math.Inf(-1)), float32(0)
	og, lo, qrot := sc.og, sc.o, sc.qrot
	clear(og)
	parents := sc.parents[:0]
	cands := sc.cands[:0]
	for lev := top; lev >= 0; lev, pow = lev-1, pow/r {
		rho := int32(t / pow)
		cands = cands[:0]
		if lev == top {
			for c := range rho + 1 {
				cands = append(cands, c)
			}
		} else {
			for _, p := range parents {
				for c := p * int32(r); c <= min(p*int32(r)+int32(r)-1, rho); c++ {
					cands = append(cands, c)
				}
			}
		}
		n := len(cands)
		if lev > 0 && n <= o.TopK {
			// Every candidate is expanded: no term at this level.
			parents, cands = cands, parents
			continue
		}
		selecting := lev > 0
		keys, vals := tr.k[lev], tr.v[lev]
		copy(qrot, q)
		ro.Rotate(qrot, n-1)
		m, l := float32(math.Inf(-1)), float32(0)
		clear(lo)
		sc.heap = sc.heap[:0]
		for b0 := 0; b0 < n; b0 += batch {
			bc := cands[b0:min(b0+batch, n)]
			s := sc.scores[:len(bc)]
			bm := float32(math.Inf(-1))
			for i, c := range bc {
				off := int(c)*row + koff
				s[i] = scale * ro.dot(qrot, keys[off:off+hd], b0+i, sc.kern.RoPEDot)
				bm = max(bm, s[i])
			}
			if bm > m {
				if l != 0 {
					f := exp32(m - bm)
					l *= f
					for j := range lo {
						lo[j] *= f
					}
				}
				m = bm
			}
			for i, c := range bc {
				w := exp32(s[i] - m)
				l += w
				off := int(c)*row + koff
				sc.kern.Axpy(lo, w, vals[off:off+hd])
			}
			if selecting {
				for i, c := range bc {
					key := s[i]
					if c == rho {
						key = inf
					}
					sc.heap.offer(o.TopK, key, s[i], c)
				}
			}
		}
		if selecting {
			// Reverse subtraction: what remains is the unselected candidates.
			parents = parents[:0]
			for _, e := range sc.heap {
				w := exp32(e.score - m)
				l -= w
				off := int(e.node)*row + koff
				sc.kern.Axpy(lo, -w, vals[off:off+hd])
				parents = append(parents, e.node)
			}
			slices.Sort(parents)
		}
		if l > 0 {
			nm := max(gm, m)
			fg, fl := exp32(gm-nm), exp32(m-nm)
			gl = gl*fg + l*fl
			for j := range og {
				og[j] = og[j]*fg + lo[j]*fl
			}
			gm = nm
		}
	}
	sc.parents, sc.cands = parents, cands
	inv := 1 / gl
	for j := range out[:hd] {
		out[j] = og[j] * inv
	}
}

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }

// entry is a top-K candidate: its selection key (the score, +Inf for the
// rightmost node), its score and its node.
type entry struct {
	key, score float32
	node       int32
}

// topK is a min-heap of at most K entries: the worst (lowest key, then
// largest node) on top.
type topK []entry

func (h topK) worse(i, j int) bool {
	return h[i].key < h[j].key || h[i].key == h[j].key && h[i].node > h[j].node
}

// offer adds a candidate. Candidates come in ascending node order, so one
// whose key ties the worst kept loses (ties go to the smaller node).
func (h *topK) offer(k int, key, score float32, node int32) {
	s := *h
	if len(s) < k {
		s = append(s, entry{key, score, node})
		for i := len(s) - 1; i > 0; {
			p := (i - 1) / 2
			if !s.worse(i, p) {
				break
			}
			s[i], s[p] = s[p], s[i]
			i = p
		}
		*h = s
		return
	}
	if !(key > s[0].key) {
		return
	}
	s[0] = entry{key, score, node}
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(s) {
			break
		}
		if c+1 < len(s) && s.worse(c+1, c) {
			c++
		}
		if !s.worse(c, i) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
}
