package nvfp4ckpt

import (
	"errors"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// Errors. Each is wrapped with the file, tensor or field concerned; test with
// errors.Is. A K that is not a multiple of 16 gives quant.ErrBlockAlign.
var (
	// ErrUnsupportedDType: a tensor's dtype is not one the layout allows.
	ErrUnsupportedDType = errors.New("unsupported dtype")
	// ErrMissingScale: a quantized weight lacks a scale tensor it needs.
	ErrMissingScale = errors.New("missing scale tensor")
	// ErrUnknownQuantAlgo: the config names an algorithm this package does not know.
	ErrUnknownQuantAlgo = errors.New("unknown quant_algo")
	// ErrBadConfig: the quantization config is malformed.
	ErrBadConfig = errors.New("bad quantization config")
	// ErrBadTensor: a tensor's shape or value is inconsistent with the layout.
	ErrBadTensor = errors.New("bad quantized tensor")
)

// Layout is the tensor layout of a quantized linear.
type Layout int

// The layouts.
const (
	LayoutNone     Layout = iota // not NVFP4 (no packed U8 weight with a weight_scale)
	LayoutModelOpt               // weight, weight_scale (plain), weight_scale_2, input_scale
	LayoutLightX2V               // weight, weight_scale (swizzled), input_global_scale, alpha
)

func (l Layout) String() string {
	switch l {
	case LayoutModelOpt:
		return "ModelOpt"
	case LayoutLightX2V:
		return "LightX2V"
	}
	return "none"
}

// Tensor name suffixes, appended to the module prefix.
const (
	SuffixWeight            = ".weight"
	SuffixWeightScale       = ".weight_scale"
	SuffixWeightScale2      = ".weight_scale_2"
	SuffixInputScale        = ".input_scale"
	SuffixInputGlobalScale  = ".input_global_scale"
	SuffixAlpha             = ".alpha"
	SuffixWeightGlobalScale = ".weight_global_scale"
	SuffixInputAbsMax       = ".input_absmax"
)

// DetectLayout tells which NVFP4 layout the module prefix uses in c. A
// packed weight (U8 or I8) with a weight_scale is NVFP4; weight_scale_2
// makes it ModelOpt, input_global_scale, alpha or weight_global_scale make it
// LightX2V. A packed weight and weight_scale with none of those is ModelOpt
// (Load then reports the missing weight_scale_2).
func DetectLayout(c *weights.Checkpoint, prefix string) Layout {
	w, err := c.Tensor(prefix + SuffixWeight)
	if err != nil || (w.DType != weights.U8 && w.DType != weights.I8) || !c.Has(prefix+SuffixWeightScale) {
		return LayoutNone
	}
	switch {
	case c.Has(prefix + SuffixWeightScale2):
		return LayoutModelOpt
	case c.Has(prefix+SuffixInputGlobalScale) || c.Has(prefix+SuffixAlpha) || c.Has(prefix+SuffixWeightGlobalScale):
		return LayoutLightX2V
	}
	return LayoutModelOpt
}

// Has reports whether c holds module prefix as NVFP4 in either layout.
func Has(c *weights.Checkpoint, prefix string) bool { return DetectLayout(c, prefix) != LayoutNone }

// Load reads the NVFP4 linear at module prefix (e.g.
// "model.layers.0.mlp.down_proj") from c, in either layout. The packed
// weight aliases the checkpoint's read-only memory map (valid until c is
// closed; use Clone to keep it longer); scales are copied when they must be
// unswizzled. Errors name the file and tensor and wrap ErrUnsupportedDType,
// ErrMissingScale, ErrBadTensor, quant.ErrBlockAlign, quant.ErrShape or
// quant.ErrNonFinite.
func Load(c *weights.Checkpoint, prefix string) (*quant.NVFP4, error) {
	w, s, n, k, err := packedWeight(c, prefix, "NVFP4", quant.NVFP4BlockSize, quant.ErrBlockAlign, SuffixWeightScale)
	if err != nil {
		return nil, err
	}
	if s.DType != weights.F8E4M3 && s.DType != weights.U8 {
		return nil, tensorErr(s, ErrUnsupportedDType, "block scales must be F8_E4M3, got %s", s.DType)
	}
	switch DetectLayout(c, prefix) {
	case LayoutLightX2V:
		return loadLightX2V(c, prefix, w, s, n, k)
	default:
		return loadModelOpt(c, prefix, w, s, n, k)
	}
}

func loadModelOpt(c *weights.Checkpoint, prefix string, w, s *weights.Tensor, n, k int) (*quant.NVFP4, error) {
	if !c.Has(prefix + SuffixWeightScale2) {
		return nil, missing(w, prefix+SuffixWeightScale2)
	}
	gs, err := scalar(c, prefix+SuffixWeightScale2)
	if err != nil {
		return nil, err
	}
	var is float32
	if c.Has(prefix + SuffixInputScale) {
		if is, err = scalar(c, prefix+SuffixInputScale); err != nil {
			return nil, err
		}
	}
	nb := k / quant.NVFP4BlockSize
	pr, pc := quant.SwizzledScaleShape(n, nb)
	var m *quant.NVFP4
	switch {
	case len(s.Shape) == 2 && s.Shape[0] == n && s.Shape[1] == nb:
		m, err = quant.NewNVFP4(n, k, w.Data, s.Data, gs, is)
	case len(s.Shape) == 1 && s.Shape[0] == pr*pc && pr*pc != n*nb:
		// TensorRT-LLM's fp4_quantize output kept as a flat swizzled buffer.
		m, err = quant.NewNVFP4Swizzled(n, k, w.Data, s.Data, gs, is)
	default:
		return nil, tensorErr(s, ErrBadTensor, "block scales shape %v, want [%d, %d] for weight %v", s.Shape, n, nb, w.Shape)
	}
	if err != nil {
		return nil, tensorErr(s, err, "")
	}
	return m, nil
}

// loadLightX2V reads seed 004's layout. The weight's scale is
// alpha*input_global_scale (what LightX2V's GEMM multiplies the block-scaled
// product by, since alpha = 1/(input_global_scale*weight_global_scale)), or
// 1/weight_global_scale when alpha is absent.
func loadLightX2V(c *weights.Checkpoint, prefix string, w, s *weights.Tensor, n, k int) (*quant.NVFP4, error) {
	var igs float32
	var err error
	switch {
	case c.Has(prefix + SuffixInputGlobalScale):
		if igs, err = scalar(c, prefix+SuffixInputGlobalScale); err != nil {
			return nil, err
		}
	case c.Has(prefix + SuffixInputAbsMax):
		amax, err := scalar(c, prefix+SuffixInputAbsMax)
		if err != nil {
			return nil, err
		}
		if amax > 0 {
			igs = quant.NVFP4GlobalDivisor / amax
		}
	}
	var gs float32
	switch {
	case c.Has(prefix+SuffixAlpha) && igs != 0:
		alpha, err := scalar(c, prefix+SuffixAlpha)
		if err != nil {
			return nil, err
		}
		gs = alpha * igs
	case c.Has(prefix + SuffixWeightGlobalScale):
		wgs, err := scalar(c, prefix+SuffixWeightGlobalScale)
		if err != nil {
			return nil, err
		}
		if wgs == 0 {
			t, _ := c.Tensor(prefix + SuffixWeightGlobalScale)
			return nil, tensorErr(t, ErrBadTensor, "weight_global_scale is 0")
		}
		gs = 1 / wgs
	case c.Has(prefix + SuffixAlpha):
		return nil, missing(w, prefix+SuffixInputGlobalScale+" (alpha alone does not give the weight's scale)")
	default:
		return nil, missing(w, prefix+SuffixAlpha+" or "+prefix+SuffixWeightGlobalScale)
	}
	var is float32
	if igs != 0 {
		is = 1 / igs
	}
	nb := k / quant.NVFP4BlockSize
	pr, pc := quant.SwizzledScaleShape(n, nb)
	if s.NumElements() != pr*pc {
		return nil, tensorErr(s, ErrBadTensor, "swizzled block scales shape %v (%d bytes), want %d x %d padded for weight %v",
			s.Shape, s.NumElements(), pr, pc, w.Shape)
	}
	m, err := quant.NewNVFP4Swizzled(n, k, w.Data, s.Data, gs, is)
	if err != nil {
		return nil, tensorErr(s, err, "")
	}
	return m, nil
}

// packedWeight reads the packed E2M1 weight (U8 or I8 [N, K/2]) of module
// prefix and its scale tensor prefix+scale, checking that K is a multiple
// of block (else the error wraps align), and returns them with N and K.
func packedWeight(c *weights.Checkpoint, prefix, format string, block int, align error, scale string) (w, s *weights.Tensor, n, k int, err error) {
	if w, err = c.Tensor(prefix + SuffixWeight); err != nil {
		return nil, nil, 0, 0, err
	}
	if w.DType != weights.U8 && w.DType != weights.I8 {
		return nil, nil, 0, 0, tensorErr(w, ErrUnsupportedDType, "packed %s weight must be U8 or I8 (two E2M1 codes a byte), got %s", format, w.DType)
	}
	if len(w.Shape) != 2 || w.Shape[0] <= 0 || w.Shape[1] <= 0 {
		return nil, nil, 0, 0, tensorErr(w, ErrBadTensor, "packed weight shape %v, want [N, K/2]", w.Shape)
	}
	n, k = w.Shape[0], 2*w.Shape[1]
	if k%block != 0 {
		return nil, nil, 0, 0, tensorErr(w, align, "packed %s weight %v holds K = %d, not a multiple of %d", format, w.Shape, k, block)
	}
	if s, err = scaleOf(c, w, prefix+scale); err != nil {
		return nil, nil, 0, 0, err
	}
	return w, s, n, k, nil
}

// scalar reads a one-element float tensor.
func scalar(c *weights.Checkpoint, name string) (float32, error) {
	t, err := c.Tensor(name)
	if err != nil {
		return 0, err
	}
	switch t.DType {
	case weights.F32, weights.BF16, weights.F16, weights.F64:
	default:
		return 0, tensorErr(t, ErrUnsupportedDType, "scale must be a float scalar, got %s", t.DType)
	}
	if t.NumElements() != 1 {
		return 0, tensorErr(t, ErrBadTensor, "scale has shape %v, want a scalar", t.Shape)
	}
	v, err := t.Float32()
	if err != nil {
		return 0, err
	}
	if f := float64(v[0]); math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, tensorErr(t, quant.ErrNonFinite, "scale is %v", f)
	}
	return v[0], nil
}

func tensorErr(t *weights.Tensor, sentinel error, format string, args ...any) error {
	err := sentinel
	if format != "" {
		err = fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
	}
	return &weights.Error{File: t.File, Tensor: t.Name, Err: err}
}

// scaleOf reads the scale tensor name of weight w, or reports it missing.
func scaleOf(c *weights.Checkpoint, w *weights.Tensor, name string) (*weights.Tensor, error) {
	if !c.Has(name) {
		return nil, missing(w, name)
	}
	return c.Tensor(name)
}

func missing(w *weights.Tensor, name string) error {
	return &weights.Error{File: w.File, Tensor: w.Name, Err: fmt.Errorf("%w %s", ErrMissingScale, name)}
}
