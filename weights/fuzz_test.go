package weights

import (
	"errors"
	"testing"
)

// FuzzParseHeader checks that parsing any byte sequence as a safetensors file
// never panics, that every failure is an *Error, and that whatever parses is
// consistent: every tensor in range, sized to its dtype and shape, and
// convertible without panicking.
func FuzzParseHeader(f *testing.F) {
	seeds := [][]byte{
		nil,
		{0},
		lenPrefix(1 << 62),
		rawFile("{}", 0),
		rawFile(`{"__metadata__":{"format":"pt"}}`, 0),
		rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8),
		rawFile(`{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}}`, 16),
		rawFile(`{"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[],"data_offsets":[3,4]}}`, 4),
		rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12),
		rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2),
		rawFile(`{"a":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4),
		rawFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4),
		rawFile(`[1,2]`, 0),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseFile("fuzz", b)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %q is not an *Error", err)
			}
			return
		}
		dataLen := int64(len(b)) - h.dataStart
		for _, ti := range h.tensors {
			if ti.begin < 0 || ti.end < ti.begin || ti.end > dataLen {
				t.Fatalf("tensor %q: offsets [%d, %d] outside %d data bytes", ti.name, ti.begin, ti.end, dataLen)
			}
			tn := &Tensor{Name: ti.name, DType: ti.dtype, Shape: ti.shape,
				Data: b[h.dataStart+ti.begin : h.dataStart+ti.end]}
			if int64(tn.NumElements()*tn.DType.Size()) != ti.end-ti.begin {
				t.Fatalf("tensor %q: %d elements of %s in %d bytes", ti.name, tn.NumElements(), tn.DType, ti.end-ti.begin)
			}
			tn.Float32()
			tn.Int64s()
		}
	})
}
