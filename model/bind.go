package model

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// Loader moves checkpoint tensors onto a backend.
type Loader struct {
	b    backend.Backend
	ck   *weights.Checkpoint
	caps backend.Capabilities // b's optional op groups, asked once (Build)
	// rename maps the names the architecture asks for to the checkpoint's
	// (DeepSeek-V4 as released: deepseek_v4_released.go); nil keeps them.
	rename func(string) string
	// fp8Block is the tile of FP8 block-scaled weights (the config's
	// weight_block_size); zero means nvfp4ckpt.DefaultFP8Block.
	fp8Block [2]int
}

// NewLoader returns a loader reading ck onto b.
func NewLoader(b backend.Backend, ck *weights.Checkpoint) *Loader {
	return &Loader{b: b, ck: ck, caps: backend.CapabilitiesOf(b)}
}

// Checkpoint is the checkpoint being read.
func (l *Loader) Checkpoint() *weights.Checkpoint { return l.ck }

// Has reports whether the checkpoint holds a tensor.
func (l *Loader) Has(name string) bool { return l.ck.Has(l.name(name)) }

// Tensor reads a tensor by the name the architecture uses.
func (l *Loader) Tensor(name string) (*weights.Tensor, error) { return l.ck.Tensor(l.name(name)) }

// name is the checkpoint's name of the tensor or module the architecture
// calls n.
func (l *Loader) name(n string) string {
	if l.rename == nil {
		return n
	}
	return l.rename(n)
}

// Float32 reads a tensor of any float dtype as float32, checking its shape.
// A shape entry of -1 matches any size.
func (l *Loader) Float32(name string, shape ...int) ([]float32, error) {
	t, err := l.Tensor(name)
	if err != nil {
		return nil, err
	}
	if err := checkShape(t, shape); err != nil {
		return nil, err
	}
	return t.Float32()
}

// Vector reads a tensor as a float32 buffer on the backend.
func (l *Loader) Vector(name string, shape ...int) (backend.Buffer, error) {
	v, err := l.Float32(name, shape...)
	if err != nil {
		return nil, err
	}
	buf := l.b.NewBuffer(len(v))
	l.b.Write(buf, 0, v)
	return buf, nil
}

// Linear uploads the linear layer module (module.weight, and module.bias when
// present) as a [rows, cols] weight in its stored format.
func (l *Loader) Linear(module string, rows, cols int) (backend.Weight, error) {
	return l.matrix(module, module+".weight", rows, cols)
}

// Matrix uploads a 2-D tensor named in full (an embedding table, say).
func (l *Loader) Matrix(name string, rows, cols int) (backend.Weight, error) {
	return l.matrix("", name, rows, cols)
}

func (l *Loader) matrix(module, name string, rows, cols int) (backend.Weight, error) {
	var err error
	var h *backend.HostWeight
	if module != "" {
		h, err = l.hostLinear(module, rows, cols) // NVFP4 when the weight is packed
	} else {
		h, err = l.dense(name, rows, cols)
	}
	if err != nil {
		return nil, err
	}
	if module != "" && l.Has(module+".bias") {
		if h.Bias, err = l.Float32(module+".bias", rows); err != nil {
			return nil, err
		}
	}
	return l.b.Upload(h)
}

// hostLinear describes the weight of module (no bias) in its stored format,
// checking its shape against [rows, cols]. A packed (U8 or I8) weight is
// NVFP4 (with a weight_scale) or MXFP4 (with a scale); an F8_E4M3 weight is
// FP8 block-scaled (with a scale or weight_scale_inv). nvfp4ckpt reads them,
// or names the scale tensor they lack.
func (l *Loader) hostLinear(module string, rows, cols int) (*backend.HostWeight, error) {
	module = l.name(module)
	f, err := l.formatOf(module)
	if err != nil {
		return nil, err
	}
	h := &backend.HostWeight{Name: module, Rows: rows, Cols: cols, Format: f}
	switch f {
	case backend.FP8Block:
		block := l.fp8Block
		if block == [2]int{} {
			block = nvfp4ckpt.DefaultFP8Block
		}
		if h.FP8, err = nvfp4ckpt.LoadFP8Block(l.ck, module, block); err == nil {
			err = linearShape(l, "FP8", module, h.FP8.Rows, h.FP8.Cols, rows, cols)
		}
	case backend.MXFP4:
		if h.MX, err = nvfp4ckpt.LoadMXFP4(l.ck, module); err == nil {
			err = linearShape(l, "MXFP4", module, h.MX.Rows, h.MX.Cols, rows, cols)
		}
	case backend.NVFP4:
		if h.Q, err = nvfp4ckpt.Load(l.ck, module); err == nil {
			err = linearShape(l, "NVFP4", module, h.Q.Rows, h.Q.Cols, rows, cols)
		}
	default:
		return l.dense(module+".weight", rows, cols)
	}
	if err != nil {
		return nil, err
	}
	return h, nil
}

// storedFormat is the format module's weight is stored in, as hostLinear
// reads it (not the format a backend keeps it in: the GPU re-blocks MXFP4
// into NVFP4 at upload). Dense weights are 0.
func (l *Loader) storedFormat(module string) (backend.Format, error) {
	return l.formatOf(l.name(module))
}

// formatOf is storedFormat for a module already named as the checkpoint
// names it.
func (l *Loader) formatOf(module string) (backend.Format, error) {
	w, err := l.ck.Tensor(module + ".weight")
	if err != nil {
		return 0, err
	}
	switch {
	case w.DType == weights.F8E4M3:
		return backend.FP8Block, nil
	case (w.DType == weights.U8 || w.DType == weights.I8) && nvfp4ckpt.IsMXFP4(l.ck, module):
		return backend.MXFP4, nil
	case w.DType == weights.U8 || w.DType == weights.I8:
		return backend.NVFP4, nil
	}
	return 0, nil
}

// linearShape reports a quantized linear whose shape is not the config's.
func linearShape(l *Loader, format, module string, r, c, rows, cols int) error {
	if r != rows || c != cols {
		return fmt.Errorf("%w: %s: %s linear %q is [%d, %d], the config implies [%d, %d]", ErrConfig, l.ck.Dir(), format, module, r, c, rows, cols)
	}
	return nil
}

// dense describes a stored f32, bf16 or f16 matrix.
func (l *Loader) dense(name string, rows, cols int) (*backend.HostWeight, error) {
	t, err := l.Tensor(name)
	if err != nil {
		return nil, err
	}
	if err := checkShape(t, []int{rows, cols}); err != nil {
		return nil, err
	}
	f, err := denseFormat(t, "F32, BF16 or F16 (or NVFP4)")
	if err != nil {
		return nil, err
	}
	return &backend.HostWeight{Name: name, Rows: rows, Cols: cols, Data: t.Data, Format: f}, nil
}

// denseFormat is the backend format of t, stored as F32, BF16 or F16; any
// other dtype is a dtypeErr naming allowed.
func denseFormat(t *weights.Tensor, allowed string) (backend.Format, error) {
	switch t.DType {
	case weights.F32:
		return backend.F32, nil
	case weights.BF16:
		return backend.BF16, nil
	case weights.F16:
		return backend.F16, nil
	}
	return 0, dtypeErr(t, allowed)
}

// dtypeErr reports a linear weight stored in a dtype the backends cannot
// multiply by (allowed names those they can): a *weights.Error naming the
// file and tensor, wrapping nvfp4ckpt.ErrUnsupportedDType.
func dtypeErr(t *weights.Tensor, allowed string) error {
	return &weights.Error{File: t.File, Tensor: t.Name,
		Err: fmt.Errorf("%w %s; linear weights must be %s", nvfp4ckpt.ErrUnsupportedDType, t.DType, allowed)}
}

// checkShape reports a tensor whose shape is not want (an entry of -1
// matches any size) with shapeErr.
func checkShape(t *weights.Tensor, want []int) error {
	if want == nil {
		return nil
	}
	ok := len(t.Shape) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] < 0 || t.Shape[i] == want[i]
	}
	if !ok {
		return shapeErr(t, want)
	}
	return nil
}

// shapeErr reports a tensor whose shape disagrees with the shape want that
// the config implies, naming the file and tensor; it wraps ErrConfig.
func shapeErr(t *weights.Tensor, want []int) error {
	return fmt.Errorf("%w: %s: tensor %q has shape %v, the config implies %v", ErrConfig, t.File, t.Name, t.Shape, want)
}

// Bind fills the exported fields of the struct *dst from tensors named
// prefix + the field's `w` tag. The `shape` tag gives the expected shape as
// comma-separated names looked up in dims (or integers). Fields of type
// backend.Weight are linear layers (the tag names the module; its .weight and
// optional .bias are read); fields of type backend.Buffer are vectors read as
// float32. A tag ending in ",optional" leaves the field nil when the tensor
// is absent.
//
//	type block struct {
//		Norm backend.Buffer `w:"input_layernorm.weight" shape:"hidden"`
//		Q    backend.Weight `w:"self_attn.q_proj" shape:"q,hidden"`
//	}
func (l *Loader) Bind(prefix string, dst any, dims map[string]int) error {
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	weightT := reflect.TypeFor[backend.Weight]()
	bufferT := reflect.TypeFor[backend.Buffer]()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("w")
		if !ok {
			continue
		}
		name, optional := strings.CutSuffix(tag, ",optional")
		name = prefix + name
		shape, err := parseShape(f.Tag.Get("shape"), dims)
		if err != nil {
			return fmt.Errorf("model: binding %s: %w", name, err)
		}
		switch f.Type {
		case weightT:
			if optional && !l.Has(name+".weight") {
				continue
			}
			if len(shape) != 2 {
				return fmt.Errorf("model: binding %s: a weight needs a 2-D shape tag", name)
			}
			w, err := l.Linear(name, shape[0], shape[1])
			if err != nil {
				return err
			}
			v.Field(i).Set(reflect.ValueOf(w))
		case bufferT:
			if optional && !l.Has(name) {
				continue
			}
			b, err := l.Vector(name, shape...)
			if err != nil {
				return err
			}
			v.Field(i).Set(reflect.ValueOf(b))
		default:
			return fmt.Errorf("model: binding %s: field %s has type %s, want backend.Weight or backend.Buffer", name, f.Name, f.Type)
		}
	}
	return nil
}

func parseShape(tag string, dims map[string]int) ([]int, error) {
	if tag == "" {
		return nil, nil
	}
	var shape []int
	for _, d := range strings.Split(tag, ",") {
		if n, err := strconv.Atoi(d); err == nil {
			shape = append(shape, n)
			continue
		}
		n, ok := dims[d]
		if !ok {
			return nil, fmt.Errorf("shape dimension %q is not defined", d)
		}
		shape = append(shape, n)
	}
	return shape, nil
}
