package layers

import (
	"fmt"
	"math"
)

// MLAShape is the geometry of DeepSeek's multi-head latent attention (MLA).
// Queries go through a low-rank path (x → q_a_proj → RMSNorm → q_b_proj);
// keys and values are compressed into one KVLoraRank-wide latent per token
// plus one RopeDim-wide rotary key shared by all heads (kv_a_proj_with_mqa),
// and kv_b_proj expands the normalized latent into per-head NopeDim keys
// and VDim values.
type MLAShape struct {
	Heads      int // num_attention_heads
	QLoraRank  int // q_lora_rank
	KVLoraRank int // kv_lora_rank
	NopeDim    int // qk_nope_head_dim: channels of q·k without position
	RopeDim    int // qk_rope_head_dim: rotary channels of q·k
	VDim       int // v_head_dim
}

// Validate reports a shape MLA cannot run, naming the config field.
func (s MLAShape) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"num_attention_heads", s.Heads}, {"q_lora_rank", s.QLoraRank}, {"kv_lora_rank", s.KVLoraRank},
		{"qk_nope_head_dim", s.NopeDim}, {"qk_rope_head_dim", s.RopeDim}, {"v_head_dim", s.VDim}} {
		if f.v <= 0 {
			return fmt.Errorf("mla: %s = %d, want > 0", f.name, f.v)
		}
	}
	if s.RopeDim%2 != 0 {
		return fmt.Errorf("mla: qk_rope_head_dim = %d, want even", s.RopeDim)
	}
	return nil
}

// QKDim is the width of one head's query and key: NopeDim + RopeDim.
func (s MLAShape) QKDim() int { return s.NopeDim + s.RopeDim }

// MLASoftmaxScale is the factor applied to MLA's q·k: QKDim^-1/2, times
// mscale² when rope_type is not "default" and mscale_all_dim is set, where
// mscale = 0.1·mscale_all_dim·ln(factor) + 1 (1 when factor <= 1), as
// transformers' yarn_apply_mscale for DeepSeek-V3/V3.2.
func MLASoftmaxScale(qkDim int, p RoPEParams) (float32, error) {
	scale := math.Pow(float64(qkDim), -0.5)
	if p.Type != "" && p.Type != "default" && p.MscaleAllDim != 0 {
		if p.Factor == 0 {
			return 0, fmt.Errorf("mla: rope_parameters.factor is required with rope_type %q and mscale_all_dim", p.Type)
		}
		m := 1.0
		if p.Factor > 1 {
			m = 0.1*p.MscaleAllDim*math.Log(p.Factor) + 1
		}
		scale *= m * m
	}
	if !finite(float64(float32(scale))) {
		return 0, fmt.Errorf("mla: softmax scale %g (mscale_all_dim %g, factor %g) is not a finite float32", scale, p.MscaleAllDim, p.Factor)
	}
	return float32(scale), nil
}

// kv_b_proj's weight is [Heads*(NopeDim+VDim), KVLoraRank]: for head h, rows
// h*(NopeDim+VDim) .. +NopeDim are W_UK[h] ([NopeDim, KVLoraRank]) and the
// next VDim rows are W_UV[h] ([VDim, KVLoraRank]).

// MLAExpandKV is the naive path's decompression of n tokens: from latent
// ([n, KVLoraRank], already RMS-normalized) and kvB (kv_b_proj, as above) it
// writes keysNope [n, Heads, NopeDim] and values [n, Heads, VDim].
func MLAExpandKV(keysNope, values, latent, kvB []float32, n int, s MLAShape) {
	r, nd, vd := s.KVLoraRank, s.NopeDim, s.VDim
	per := nd + vd
	for t := range n {
		c := latent[t*r : (t+1)*r]
		for h := range s.Heads {
			for i := range per {
				w := kvB[(h*per+i)*r : (h*per+i+1)*r]
				var d float32
				for j, cv := range c {
					d += w[j] * cv
				}
				if i < nd {
					keysNope[(t*s.Heads+h)*nd+i] = d
				} else {
					values[(t*s.Heads+h)*vd+i-nd] = d
				}
			}
		}
	}
}

// MLAAbsorbQuery folds W_UK into the nope query of one token, for the
// absorbed path: qLat[h] = W_UK[h]ᵀ · qNope[h], so that qLat[h]·c equals
// qNope[h]·(W_UK[h]·c) for every latent c. qNope is [Heads, NopeDim] with
// head h at qNope[h*stride:], qLat is [Heads, KVLoraRank].
func MLAAbsorbQuery(qLat, qNope []float32, stride int, kvB []float32, s MLAShape) {
	r, nd := s.KVLoraRank, s.NopeDim
	per := nd + s.VDim
	for h := range s.Heads {
		ql := qLat[h*r : (h+1)*r]
		clear(ql)
		qn := qNope[h*stride : h*stride+nd]
		for i, qv := range qn {
			w := kvB[(h*per+i)*r : (h*per+i+1)*r]
			for j, wv := range w {
				ql[j] += qv * wv
			}
		}
	}
}

// MLAExpandOutput applies W_UV to the latent attention output of one token:
// out[h] = W_UV[h] · outLat[h], with outLat [Heads, KVLoraRank] and out
// [Heads, VDim] (the input of o_proj).
func MLAExpandOutput(out, outLat, kvB []float32, s MLAShape) {
	r, nd, vd := s.KVLoraRank, s.NopeDim, s.VDim
	per := nd + vd
	for h := range s.Heads {
		ol := outLat[h*r : (h+1)*r]
		for i := range vd {
			w := kvB[(h*per+nd+i)*r : (h*per+nd+i+1)*r]
			var d float32
			for j, wv := range w {
				d += wv * ol[j]
			}
			out[h*vd+i] = d
		}
	}
}

// MLACacheBytesPerToken is the cache memory one token takes per layer on
// the absorbed path: the latent, the rope key and, with an indexer, its key,
// all float32.
func MLACacheBytesPerToken(s MLAShape, indexerKeyDim int) int {
	return 4 * (s.KVLoraRank + s.RopeDim + indexerKeyDim)
}
