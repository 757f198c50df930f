package dsa

import (
	"math"

	"github.com/manifoldlm/manifold/layers"
)

// Attend computes one query's attention over the selected keys only, with
// per-head keys and values (the naive MLA path, keys and values expanded
// from the latent):
//
//	out[h] = Σ_{t∈idx} softmax_t(scale · q[h]·K[t,h]) · V[t,h]
//
// q is [heads, dk] and out [heads, dv]. Token t's key for head h starts at
// keys[t*kStride + h*dk], its value at values[t*vStride + h*dv]. idx lists the
// selected tokens (non-empty); p is scratch of at least len(idx) values.
func Attend(out, q, keys, values []float32, idx []int32, heads, dk, dv, kStride, vStride int, scale float32, p []float32) {
	p = p[:len(idx)]
	for h := range heads {
		qh := q[h*dk : (h+1)*dk]
		m := float32(math.Inf(-1))
		for j, t := range idx {
			p[j] = seqDot(qh, keys[int(t)*kStride+h*dk:][:dk]) * scale
			m = max(m, p[j])
		}
		Normalize(p, m)
		o := out[h*dv : (h+1)*dv]
		clear(o)
		for j, t := range idx {
			addScaled(o, p[j], values[int(t)*vStride+h*dv:][:dv])
		}
	}
}

// AttendLatent computes one query's attention over the selected tokens in
// MLA's compressed space (the absorbed path): every head attends to the same
// cached latent c[t] (rank channels) and rope key r[t] (ropeDim channels):
//
//	out[h] = Σ_{t∈idx} softmax_t(scale · (qLat[h]·c[t] + qRope[h]·r[t])) · c[t]
//
// qLat is [heads, rank] (the nope query with W_UK absorbed), qRope [heads,
// ropeDim] and out [heads, rank] (W_UV is applied afterwards). Token t's
// latent starts at latent[t*lStride], its rope key at rope[t*rStride]. idx
// lists the selected tokens (non-empty); p is scratch of at least
// heads*len(idx) values.
func AttendLatent(out, qLat, qRope, latent, rope []float32, idx []int32, heads, rank, ropeDim, lStride, rStride int, scale float32, p []float32) {
	AttendLatentHeads(out, qLat, qRope, latent, rope, idx, 0, heads, rank, ropeDim, lStride, rStride, scale, p)
}

// AttendLatentHeads is AttendLatent for heads [h0, h1) only (out, qLat and
// qRope are still indexed by absolute head); p needs (h1-h0)*len(idx)
// values. Backends split the heads of one query over threads with it.
func AttendLatentHeads(out, qLat, qRope, latent, rope []float32, idx []int32, h0, h1, rank, ropeDim, lStride, rStride int, scale float32, p []float32) {
	n := len(idx)
	p = p[:(h1-h0)*n]
	// Token-major loops: each cached row is read once for all heads.
	for j, t := range idx {
		c := latent[int(t)*lStride:]
		c = c[:rank]
		r := rope[int(t)*rStride:]
		r = r[:ropeDim]
		for h := h0; h < h1; h++ {
			ql := qLat[h*rank : (h+1)*rank]
			qr := qRope[h*ropeDim : (h+1)*ropeDim]
			p[(h-h0)*n+j] = (seqDot(ql, c) + seqDot(qr, r)) * scale
		}
	}
	for h := h0; h < h1; h++ {
		ph := p[(h-h0)*n : (h-h0+1)*n]
		m := float32(math.Inf(-1))
		for _, v := range ph {
			m = max(m, v)
		}
		Normalize(ph, m)
	}
	clear(out[h0*rank : h1*rank])
	for j, t := range idx {
		c := latent[int(t)*lStride:]
		c = c[:rank]
		for h := h0; h < h1; h++ {
			addScaled(out[h*rank:(h+1)*rank], p[(h-h0)*n+j], c)
		}
	}
}

// seqDot is Σ b[i]·a[i] over len(b) values, accumulated in order in one
// float32 sum.
func seqDot(a, b []float32) float32 {
	var dot float32
	for i, v := range b {
		dot += a[i] * v
	}
	return dot
}

// addScaled adds a·x to o[:len(x)].
func addScaled(o []float32, a float32, x []float32) {
	for i, v := range x {
		o[i] += a * v
	}
}

// Normalize turns logits p (max m) into softmax probabilities in place.
func Normalize(p []float32, m float32) {
	var sum float64
	for j, v := range p {
		e := float32(math.Exp(float64(v - m)))
		p[j] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for j := range p {
		p[j] *= inv
	}
}

// AttendMLA computes one query's MLA attention over the selected tokens on
// the naive path, keys and values expanded per head from the latent but the
// rope key kept once per token (it is shared by all heads):
//
//	score(h, t) = scale · (qNope[h]·kNope[t,h] + qRope[h]·kRope[t])
//	out[h]      = Σ_{t∈idx} softmax_t(score(h, t)) · v[t,h]
//
// q is [Heads, QKDim] (nope channels, then rope), out [Heads, VDim]. kv holds
// kv_b_proj's output per token, [Heads, NopeDim+VDim] (k_nope, then v) at
// kv[t*Heads*(NopeDim+VDim)]; kRope is [*, RopeDim]. idx lists the selected
// tokens (non-empty); p is scratch of at least len(idx) values.
func AttendMLA(out, q, kv, kRope []float32, idx []int32, s layers.MLAShape, scale float32, p []float32) {
	AttendMLAHeads(out, q, kv, kRope, idx, s, 0, s.Heads, scale, p)
}

// AttendMLAHeads is AttendMLA for heads [h0, h1) only (buffers are still
// indexed by absolute head).
func AttendMLAHeads(out, q, kv, kRope []float32, idx []int32, s layers.MLAShape, h0, h1 int, scale float32, p []float32) {
	nd, rd, vd, qk := s.NopeDim, s.RopeDim, s.VDim, s.QKDim()
	per := nd + vd
	row := s.Heads * per
	p = p[:len(idx)]
	for h := h0; h < h1; h++ {
		qn := q[h*qk : h*qk+nd]
		qr := q[h*qk+nd : (h+1)*qk]
		m := float32(math.Inf(-1))
		for j, t := range idx {
			dot := seqDot(qn, kv[int(t)*row+h*per:][:nd])
			p[j] = (dot + seqDot(qr, kRope[int(t)*rd:][:rd])) * scale
			m = max(m, p[j])
		}
		Normalize(p, m)
		o := out[h*vd : (h+1)*vd]
		clear(o)
		for j, t := range idx {
			addScaled(o, p[j], kv[int(t)*row+h*per+nd:][:vd])
		}
	}
}
