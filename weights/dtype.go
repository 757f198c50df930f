package weights

import "fmt"

// DType is the element type of a stored tensor, named as in safetensors.
type DType uint8

// The element types. The zero value is not a valid DType.
const (
	F32    DType = iota + 1 // "F32": IEEE float32
	F16                     // "F16": IEEE half precision
	BF16                    // "BF16": bfloat16
	F8E4M3                  // "F8_E4M3": FP8 E4M3 (fn: no Inf, max 448)
	U8                      // "U8"
	I8                      // "I8"
	I32                     // "I32"
	I64                     // "I64"
	F64                     // "F64"
	I16                     // "I16"
	U16                     // "U16"
	U32                     // "U32"
	U64                     // "U64"
	Bool                    // "BOOL": one byte per element
	F8E5M2                  // "F8_E5M2"
	F8E8M0                  // "F8_E8M0": unsigned power of two 2^(e-127) (UE8M0 block scales)
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	F32: {"F32", 4}, F16: {"F16", 2}, BF16: {"BF16", 2}, F8E4M3: {"F8_E4M3", 1},
	U8: {"U8", 1}, I8: {"I8", 1}, I32: {"I32", 4}, I64: {"I64", 8},
	F64: {"F64", 8}, I16: {"I16", 2}, U16: {"U16", 2}, U32: {"U32", 4}, U64: {"U64", 8},
	Bool: {"BOOL", 1}, F8E5M2: {"F8_E5M2", 1}, F8E8M0: {"F8_E8M0", 1},
}

// ParseDType returns the DType with the safetensors name s ("F32", "BF16",
// "F8_E4M3", ...). An unknown name gives an error wrapping ErrUnknownDType.
func ParseDType(s string) (DType, error) {
	for d := F32; int(d) < len(dtypeInfo); d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownDType, s)
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d >= F32 && int(d) < len(dtypeInfo) }

// String returns the safetensors name of d.
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// Size returns the number of bytes per element, or 0 for an invalid DType.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}
