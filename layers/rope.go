package layers

import (
	"fmt"
	"math"
)

// RoPEParams describes rotary position embeddings as HuggingFace's
// rope_parameters (or the older rope_scaling) does.
type RoPEParams struct {
	Type                  string  // "default", "linear", "llama3", "yarn"
	Theta                 float64 // rope_theta
	Factor                float64 // scaling factor (linear, llama3, yarn)
	LowFreqFactor         float64 // llama3
	HighFreqFactor        float64 // llama3
	OriginalMaxPositions  float64 // llama3, yarn
	BetaFast, BetaSlow    float64 // yarn; 0 means the defaults 32 and 1
	AttentionFactor       float64 // yarn; 0 means derived from Factor and the mscales
	Mscale, MscaleAllDim  float64 // yarn
	Truncate              *bool   // yarn; nil means true
	PartialRotaryFactor   float64 // fraction of the head dim rotated; 0 means 1
	MaxPositionEmbeddings float64 // the model's max_position_embeddings (yarn's factor fallback)
}

// RoPE is a rotary embedding ready to apply: one inverse frequency per rotated
// pair and the factor that scales cos and sin (yarn's attention factor).
type RoPE struct {
	InvFreq     []float32
	Scale       float32
	Interleaved bool // pairs (2i, 2i+1) instead of (i, i+dim/2)
}

// Dim is the number of rotated channels.
func (r *RoPE) Dim() int { return 2 * len(r.InvFreq) }

// NewRoPE computes the inverse frequencies for a head of headDim channels, as
// transformers' modeling_rope_utils does (in float32, like torch).
func NewRoPE(p RoPEParams, headDim int) (*RoPE, error) {
	frac := p.PartialRotaryFactor
	if frac == 0 {
		frac = 1
	}
	dim := int(float64(headDim) * frac)
	if dim <= 0 || dim%2 != 0 {
		return nil, fmt.Errorf("rope: rotary dim %d (head_dim %d × partial_rotary_factor %g) must be even and positive", dim, headDim, frac)
	}
	if p.Theta <= 0 {
		return nil, fmt.Errorf("rope: rope_theta %g must be positive", p.Theta)
	}
	half := dim / 2
	base := make([]float32, half)
	for i := range base {
		// torch: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
		e := float32(2*i) / float32(dim)
		base[i] = float32(1 / math.Pow(p.Theta, float64(e)))
	}
	r := &RoPE{InvFreq: base, Scale: 1}
	switch p.Type {
	case "", "default":
	case "linear":
		if p.Factor <= 0 {
			return nil, fmt.Errorf("rope: linear scaling needs factor > 0, got %g", p.Factor)
		}
		for i := range base {
			base[i] = float32(float64(base[i]) / p.Factor)
		}
	case "llama3":
		if p.Factor <= 0 || p.LowFreqFactor <= 0 || p.HighFreqFactor <= 0 || p.OriginalMaxPositions <= 0 {
			return nil, fmt.Errorf("rope: llama3 scaling needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings")
		}
		lowWave := p.OriginalMaxPositions / p.LowFreqFactor
		highWave := p.OriginalMaxPositions / p.HighFreqFactor
		for i, f := range base {
			wave := 2 * math.Pi / float64(f)
			scaled := float64(f)
			if wave > lowWave {
				scaled = float64(f) / p.Factor
			}
			smooth := (p.OriginalMaxPositions/wave - p.LowFreqFactor) / (p.HighFreqFactor - p.LowFreqFactor)
			if wave <= lowWave && wave >= highWave { // medium frequencies: interpolate
				scaled = (1-smooth)*scaled/p.Factor + smooth*scaled
			}
			base[i] = float32(scaled)
		}
	case "yarn":
		if err := yarn(r, p, dim); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("rope: unsupported rope_type %q (supported: default, linear, llama3, yarn)", p.Type)
	}
	return r, nil
}

func yarn(r *RoPE, p RoPEParams, dim int) error {
	factor := p.Factor
	if factor == 0 && p.OriginalMaxPositions > 0 {
		factor = p.MaxPositionEmbeddings / p.OriginalMaxPositions
	}
	if factor <= 0 || p.OriginalMaxPositions <= 0 {
		return fmt.Errorf("rope: yarn scaling needs factor and original_max_position_embeddings")
	}
	mscale := func(scale, m float64) float64 {
		if scale <= 1 {
			return 1
		}
		return 0.1*m*math.Log(scale) + 1
	}
	att := p.AttentionFactor
	if att == 0 {
		if p.Mscale != 0 && p.MscaleAllDim != 0 {
			att = mscale(factor, p.Mscale) / mscale(factor, p.MscaleAllDim)
		} else {
			att = mscale(factor, 1)
		}
	}
	betaFast, betaSlow := p.BetaFast, p.BetaSlow
	if betaFast == 0 {
		betaFast = 32
	}
	if betaSlow == 0 {
		betaSlow = 1
	}
	corr := func(rot float64) float64 {
		return float64(dim) * math.Log(p.OriginalMaxPositions/(rot*2*math.Pi)) / (2 * math.Log(p.Theta))
	}
	low, high := corr(betaFast), corr(betaSlow)
	// transformers fails on these (a zero division or a math domain error);
	// here they would turn every rotation into NaN.
	if !finite(low) || !finite(high) {
		return fmt.Errorf("rope: yarn correction range [%g, %g] is not finite (rope_theta %g must be > 1, beta_fast %g and beta_slow %g > 0)",
			low, high, p.Theta, betaFast, betaSlow)
	}
	if !finite(float64(float32(att))) {
		return fmt.Errorf("rope: yarn attention factor %g (from attention_factor, mscale, mscale_all_dim) is not a finite float32", att)
	}
	if p.Truncate == nil || *p.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(dim-1))
	if low == high {
		high += 0.001
	}
	for i, f := range r.InvFreq {
		ramp := float32((float64(i) - low) / (high - low))
		ramp = max(0, min(1, ramp))
		extra := 1 - ramp // share of the extrapolated (unscaled) frequency
		interp := f / float32(factor)
		r.InvFreq[i] = interp*(1-extra) + f*extra
	}
	r.Scale = float32(att)
	return nil
}

// finite reports whether v is neither infinite nor NaN.
func finite(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }

// ApplyRoPE rotates, in place, the channels [off, off+r.Dim()) of every
// vector of x. x holds rows of heads vectors of stride values; row i is at
// position pos0+i. With inverse set it applies the inverse rotation (sin
// negated), as DeepSeek-V4 does on its attention output.
func ApplyRoPE(x []float32, rows, heads, stride, off, pos0 int, r *RoPE, inverse bool) {
	half := len(r.InvFreq)
	cos := make([]float32, half)
	sin := make([]float32, half)
	for row := 0; row < rows; row++ {
		RoPEAngles(cos, sin, pos0+row, r, inverse)
		for h := 0; h < heads; h++ {
			v := x[(row*heads+h)*stride+off:]
			RotatePairs(v, cos, sin, r.Interleaved)
		}
	}
}

// RoPEAngles fills cos and sin for one position, scaled by r.Scale, matching
// torch's float32 arithmetic (angle = float32(pos) * invFreq in float32).
func RoPEAngles(cos, sin []float32, pos int, r *RoPE, inverse bool) {
	for i, f := range r.InvFreq {
		a := float64(float32(pos) * f)
		cos[i] = float32(math.Cos(a)) * r.Scale
		s := float32(math.Sin(a)) * r.Scale
		if inverse {
			s = -s
		}
		sin[i] = s
	}
}

// RotatePairs rotates the first 2*len(cos) values of v.
func RotatePairs(v, cos, sin []float32, interleaved bool) {
	half := len(cos)
	if interleaved {
		for i := 0; i < half; i++ {
			a, b := v[2*i], v[2*i+1]
			v[2*i] = a*cos[i] - b*sin[i]
			v[2*i+1] = b*cos[i] + a*sin[i]
		}
		return
	}
	for i := 0; i < half; i++ {
		a, b := v[i], v[i+half]
		v[i] = a*cos[i] - b*sin[i]
		v[i+half] = b*cos[i] + a*sin[i]
	}
}
