package weights

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/manifoldlm/manifold/quant"
)

// Tensor is one stored tensor. Data holds its raw little-endian bytes; for a
// tensor from a Checkpoint it is a slice of a read-only memory map.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
	File  string // the file it came from
}

// NumElements returns the product of the dimensions (1 for a scalar).
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// check verifies that Data holds exactly prod(Shape)*Size bytes.
func (t *Tensor) check() (int, error) {
	if !t.DType.Valid() {
		return 0, errf(t.File, t.Name, ErrUnknownDType, "%v", t.DType)
	}
	size, ok := byteSize(t.DType, t.Shape)
	if !ok || size != int64(len(t.Data)) {
		return 0, errf(t.File, t.Name, ErrSizeMismatch, "%s %v needs %s bytes, Data holds %d",
			t.DType, t.Shape, sizeString(size, ok), len(t.Data))
	}
	return len(t.Data) / t.DType.Size(), nil
}

var littleEndianHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Float32 returns the tensor's values as a new float32 slice. F32, F16, BF16,
// F8_E4M3, F8_E5M2, F8_E8M0 and F64 convert; other dtypes give an error wrapping
// ErrDType.
func (t *Tensor) Float32() ([]float32, error) {
	n, err := t.check()
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	src := t.Data
	switch t.DType {
	case F32:
		if littleEndianHost && n > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*n), src)
		} else {
			for i := range out {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			}
		}
	case BF16:
		quant.DecodeBF16(out, src)
	case F16:
		quant.DecodeF16(out, src)
	case F8E4M3:
		quant.DecodeE4M3(out, src)
	case F8E5M2: // the top byte of a float16
		for i, b := range src {
			out[i] = quant.F16ToFloat32(uint16(b) << 8)
		}
	case F8E8M0:
		for i, b := range src {
			out[i] = quant.E8M0ToFloat32(b)
		}
	case F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	default:
		return nil, errf(t.File, t.Name, ErrDType, "cannot convert %s to float32", t.DType)
	}
	return out, nil
}

// Int64s returns the tensor's values widened to int64. I64, I32, I16, I8,
// U32, U16, U8 and BOOL convert; U64 converts when every value fits; float
// dtypes give an error wrapping ErrDType.
func (t *Tensor) Int64s() ([]int64, error) {
	n, err := t.check()
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	src := t.Data
	le := binary.LittleEndian
	switch t.DType {
	case I64:
		for i := range out {
			out[i] = int64(le.Uint64(src[8*i:]))
		}
	case U64:
		for i := range out {
			v := le.Uint64(src[8*i:])
			if v > math.MaxInt64 {
				return nil, errf(t.File, t.Name, ErrDType, "U64 value %d at index %d overflows int64", v, i)
			}
			out[i] = int64(v)
		}
	case I32:
		for i := range out {
			out[i] = int64(int32(le.Uint32(src[4*i:])))
		}
	case U32:
		for i := range out {
			out[i] = int64(le.Uint32(src[4*i:]))
		}
	case I16:
		for i := range out {
			out[i] = int64(int16(le.Uint16(src[2*i:])))
		}
	case U16:
		for i := range out {
			out[i] = int64(le.Uint16(src[2*i:]))
		}
	case I8:
		for i, b := range src {
			out[i] = int64(int8(b))
		}
	case U8, Bool:
		for i, b := range src {
			out[i] = int64(b)
		}
	default:
		return nil, errf(t.File, t.Name, ErrDType, "cannot convert %s to int64", t.DType)
	}
	return out, nil
}
