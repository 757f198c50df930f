package model

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// What the mixture-of-experts architectures share (DeepSeek-V3 and V3.2,
// Qwen3-MoE): SwiGLU experts read one module per expert or fused, and the
// host path of a routed MoE, which reads the router logits back, lets the
// architecture pick each token's experts and their weights on the host, and
// runs one MatMul per picked expert over the rows routed to it. The host
// path needs only core backend ops, so it runs on every backend.

// v32MLP is a SwiGLU MLP: down(silu(gate x) * up x).
type v32MLP struct {
	Gate, Up, Down backend.Weight
	Width          int // intermediate size
}

func loadMLP(b backend.Backend, l *Loader, prefix string, width, hidden int) (*v32MLP, error) {
	mlp := &v32MLP{Width: width}
	var err error
	if mlp.Gate, err = l.Linear(prefix+"gate_proj", width, hidden); err != nil {
		return nil, err
	}
	if mlp.Up, err = l.Linear(prefix+"up_proj", width, hidden); err != nil {
		return nil, err
	}
	if mlp.Down, err = l.Linear(prefix+"down_proj", hidden, width); err != nil {
		return nil, err
	}
	return mlp, nil
}

// loadExperts reads E routed experts of width I under prefix ("...mlp."),
// stored one module per expert (experts.N.gate_proj, as the released
// checkpoints and save_pretrained write them) or fused
// (experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I],
// transformers' in-memory layout). A missing expert is the error naming its
// tensor.
func loadExperts(b backend.Backend, l *Loader, prefix string, E, I, H int) ([]v32MLP, error) {
	experts := make([]v32MLP, E)
	var err error
	if l.Has(prefix + "experts.gate_up_proj") {
		gu, down := prefix+"experts.gate_up_proj", prefix+"experts.down_proj"
		for e := range experts {
			x := &experts[e]
			x.Width = I
			if x.Gate, err = uploadRows(b, l, gu, []int{E, 2 * I, H}, 2*e*I, I); err != nil {
				return nil, err
			}
			if x.Up, err = uploadRows(b, l, gu, []int{E, 2 * I, H}, (2*e+1)*I, I); err != nil {
				return nil, err
			}
			if x.Down, err = uploadRows(b, l, down, []int{E, H, I}, e*H, H); err != nil {
				return nil, err
			}
		}
		return experts, nil
	}
	for e := range experts {
		x, err := loadMLP(b, l, fmt.Sprintf("%sexperts.%d.", prefix, e), I, H)
		if err != nil {
			return nil, err
		}
		experts[e] = *x
	}
	return experts, nil
}

// moeScratch is a sequence's scratch for the host MoE path: the router
// logits on the backend and on the host, the picks, the rows routed to each
// expert, and the per-expert activations.
type moeScratch struct {
	rl, xe, ye, ge, ue backend.Buffer
	hostLogits, routeW []float32
	routeIdx           []int32
	expertRows         [][]int32
	expertScale        [][]float32
	topk               layers.TopKScratch
}

// growMoE makes the scratch hold n rows of E experts of width I over hidden
// size H.
func (s *moeScratch) growMoE(b backend.Backend, n, E, I, H int) {
	s.rl = b.NewBuffer(n * max(E, 1))
	s.xe = b.NewBuffer(n * H)
	s.ye = b.NewBuffer(n * H)
	s.ge = b.NewBuffer(n * max(I, 1))
	s.ue = b.NewBuffer(n * max(I, 1))
}

// routerLogits computes the router logits of n rows of h with router
// ([E, H]) and reads them back; it returns them with the [n, K] pick and
// weight slices for the architecture's routing to fill.
func (s *moeScratch) routerLogits(b backend.Backend, router backend.Weight, h backend.Buffer, n, E, K int) (logits []float32, idx []int32, w []float32) {
	rl := b.View(s.rl, 0, n*E)
	b.MatMul(rl, h, router, n)
	if cap(s.hostLogits) < n*E || cap(s.routeIdx) < n*K {
		s.hostLogits = make([]float32, n*E)
		s.routeIdx = make([]int32, n*K)
		s.routeW = make([]float32, n*K)
	}
	logits, idx, w = s.hostLogits[:n*E], s.routeIdx[:n*K], s.routeW[:n*K]
	b.Read(logits, rl, 0)
	return logits, idx, w
}

// runExperts adds to out ([n, H]) each row's picked experts (idx, [n, K])
// applied to its row of h, weighted by w: out[i] += sum_j w_ij
// expert_idx_ij(h_i), the experts run in expert order, each over the rows
// routed to it.
func (s *moeScratch) runExperts(b backend.Backend, experts []v32MLP, out, h backend.Buffer, idx []int32, w []float32, n, K, H int) {
	E := len(experts)
	if len(s.expertRows) < E {
		s.expertRows = make([][]int32, E)
		s.expertScale = make([][]float32, E)
	}
	for e := range E {
		s.expertRows[e] = s.expertRows[e][:0]
		s.expertScale[e] = s.expertScale[e][:0]
	}
	for i := range n {
		for j := range K {
			e := idx[i*K+j]
			s.expertRows[e] = append(s.expertRows[e], int32(i))
			s.expertScale[e] = append(s.expertScale[e], w[i*K+j])
		}
	}
	for e := range E {
		rows := s.expertRows[e]
		cnt := len(rows)
		if cnt == 0 {
			continue
		}
		x := &experts[e]
		xe, ye := b.View(s.xe, 0, cnt*H), b.View(s.ye, 0, cnt*H)
		ge, ue := b.View(s.ge, 0, cnt*x.Width), b.View(s.ue, 0, cnt*x.Width)
		b.GatherRows(xe, h, rows, H)
		b.MatMul(ge, xe, x.Gate, cnt)
		b.MatMul(ue, xe, x.Up, cnt)
		b.SwiGLU(ge, ge, ue, 0)
		b.MatMul(ye, ge, x.Down, cnt)
		b.ScatterAddRows(out, ye, rows, s.expertScale[e], H)
	}
}
