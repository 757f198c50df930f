package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ScaleDType is the element type of a block-scaled format's scale tensor: the
// same ".scale" name holds UE8M0 bytes in DeepSeek-V4's instruct checkpoints
// and float32 powers of two in its -Base ones; DeepSeek-V3's
// "weight_scale_inv" holds arbitrary float32 values.
type ScaleDType uint8

// The scale element types.
const (
	ScaleE8M0 ScaleDType = iota + 1 // one byte: 2^(e-127)
	ScaleF32                        // four bytes, little-endian float32
)

// scaleDTypes names and sizes the scale types, by value.
var scaleDTypes = [...]struct {
	name string
	size int
}{ScaleE8M0: {"e8m0", 1}, ScaleF32: {"f32", 4}}

func (s ScaleDType) String() string {
	if s.Size() == 0 {
		return fmt.Sprintf("ScaleDType(%d)", uint8(s))
	}
	return scaleDTypes[s].name
}

// Size is the number of bytes of one scale, 0 for an unknown ScaleDType.
func (s ScaleDType) Size() int {
	if int(s) >= len(scaleDTypes) {
		return 0
	}
	return scaleDTypes[s].size
}

// ErrScale: a scale tensor has the wrong element type or count for its
// weight. Wrapped with the details; test with errors.Is.
var ErrScale = errors.New("bad block scale")

// FP8Block is a Rows x Cols matrix (N out features x K in features) of FP8
// E4M3 codes in which each BlockRows x BlockCols tile shares one scale that
// multiplies:
//
//	W[r][k] = e4m3(Data[r*K + k]) * scale[r/BlockRows][k/BlockCols]
//
// Scales is row-major [ceil(N/BlockRows), ceil(K/BlockCols)] of ScaleDType.
// It is DeepSeek's fine-grained FP8: V3's weight + weight_scale_inv (float32,
// 128x128), V4's weight + scale (UE8M0 or float32, 128x128), V4.1's dense
// weights (UE8M0, 32x32). Edge tiles are partial; Rows and Cols need not be
// multiples of the block.
type FP8Block struct {
	Rows, Cols           int
	BlockRows, BlockCols int
	Data                 []byte // [Rows, Cols] E4M3 codes
	Scales               []byte // [ScaleRows, ScaleCols] of ScaleDType
	ScaleDType           ScaleDType
}

// NewFP8Block checks and wraps existing data; the slices are used, not copied.
func NewFP8Block(rows, cols, blockRows, blockCols int, data, scales []byte, sd ScaleDType) (*FP8Block, error) {
	m := &FP8Block{Rows: rows, Cols: cols, BlockRows: blockRows, BlockCols: blockCols, Data: data, Scales: scales, ScaleDType: sd}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// ScaleShape is the shape of the scale tensor: [ceil(Rows/BlockRows),
// ceil(Cols/BlockCols)].
func (m *FP8Block) ScaleShape() (rows, cols int) {
	return ceilDiv(m.Rows, m.BlockRows), ceilDiv(m.Cols, m.BlockCols)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Validate reports whether m is well formed: positive shape and block, buffer
// sizes matching them, a known scale type and finite, positive scales.
func (m *FP8Block) Validate() error {
	if m.Rows <= 0 || m.Cols <= 0 || m.BlockRows <= 0 || m.BlockCols <= 0 {
		return fmt.Errorf("fp8 block %dx%d (blocks %dx%d): %w", m.Rows, m.Cols, m.BlockRows, m.BlockCols, ErrShape)
	}
	if len(m.Data) != m.Rows*m.Cols {
		return fmt.Errorf("fp8 block %dx%d: data has %d bytes, want %d: %w", m.Rows, m.Cols, len(m.Data), m.Rows*m.Cols, ErrShape)
	}
	sr, sc := m.ScaleShape()
	size := m.ScaleDType.Size()
	if size == 0 {
		return fmt.Errorf("fp8 block %dx%d: scale type %v: %w", m.Rows, m.Cols, m.ScaleDType, ErrScale)
	}
	if len(m.Scales) != sr*sc*size {
		return fmt.Errorf("fp8 block %dx%d: scales have %d bytes, want [%d, %d] %s = %d: %w",
			m.Rows, m.Cols, len(m.Scales), sr, sc, m.ScaleDType, sr*sc*size, ErrScale)
	}
	for i := range sr * sc {
		if s := m.scale(i); !isFinite(s) || s < 0 {
			return fmt.Errorf("fp8 block %dx%d: scale [%d, %d] is %v: %w", m.Rows, m.Cols, i/sc, i%sc, s, ErrNonFinite)
		}
	}
	return nil
}

// scale returns scale number i (row-major in the scale tensor).
func (m *FP8Block) scale(i int) float32 {
	if m.ScaleDType == ScaleE8M0 {
		return E8M0ToFloat32(m.Scales[i])
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(m.Scales[4*i:]))
}

// Scale returns the scale of the tile holding element (r, k).
func (m *FP8Block) Scale(r, k int) float32 {
	_, sc := m.ScaleShape()
	return m.scale(r/m.BlockRows*sc + k/m.BlockCols)
}

// Bytes is the storage size of the codes and scales.
func (m *FP8Block) Bytes() int { return len(m.Data) + len(m.Scales) }

// DequantizeRow writes row r as float32 into dst (len >= Cols):
// e4m3 * scale, DeepSeek's weight_dequant.
func (m *FP8Block) DequantizeRow(dst []float32, r int) {
	k := m.Cols
	_, sc := m.ScaleShape()
	row := m.Data[r*k : (r+1)*k]
	base := r / m.BlockRows * sc
	for b := range sc {
		s := m.scale(base + b)
		lo, hi := b*m.BlockCols, min(k, (b+1)*m.BlockCols)
		d := dst[lo:hi]
		for j, c := range row[lo:hi] {
			d[j] = e4m3Table[c] * s
		}
	}
}

// Dequantize returns the matrix as float32, row-major Rows x Cols.
func (m *FP8Block) Dequantize() []float32 { return dequantizeAll(m, m.Rows, m.Cols) }

// RowDecoder is a matrix that can decode one row at a time (FP8Block, MXFP4,
// NVFP4).
type RowDecoder interface {
	DequantizeRow(dst []float32, r int)
}

func dequantizeAll(m RowDecoder, rows, cols int) []float32 {
	out := make([]float32, rows*cols)
	for r := range rows {
		m.DequantizeRow(out[r*cols:(r+1)*cols], r)
	}
	return out
}

// pow2Ceil returns the E8M0 code of the smallest power of two >= f (f > 0
// finite), clamped to [1, 254]; 127 (1.0) for f <= 0.
func pow2Ceil(f float32) uint8 {
	if !(f > 0) {
		return 127
	}
	_, e := math.Frexp(float64(f)) // f = m * 2^e, m in [0.5, 1)
	if math.Ldexp(0.5, e) == float64(f) {
		e-- // an exact power of two
	}
	return uint8(min(254, max(1, e+127)))
}

// QuantizeFP8Block quantizes the row-major rows x cols matrix w to FP8 E4M3
// with one scale per blockRows x blockCols tile: amax/448, rounded up to a
// power of two for ScaleE8M0 (DeepSeek's scale_fmt ue8m0) or kept as is for
// ScaleF32. Non-finite weights give an error wrapping ErrNonFinite.
func QuantizeFP8Block(w []float32, rows, cols, blockRows, blockCols int, sd ScaleDType) (*FP8Block, error) {
	m := &FP8Block{Rows: rows, Cols: cols, BlockRows: blockRows, BlockCols: blockCols, ScaleDType: sd, Data: make([]byte, rows*cols)}
	if rows <= 0 || cols <= 0 || blockRows <= 0 || blockCols <= 0 || len(w) != rows*cols || sd.Size() == 0 {
		return nil, fmt.Errorf("quantize fp8 block %dx%d (blocks %dx%d, %d values, %v): %w", rows, cols, blockRows, blockCols, len(w), sd, ErrShape)
	}
	sr, sc := m.ScaleShape()
	m.Scales = make([]byte, sr*sc*sd.Size())
	for bi := range sr {
		for bj := range sc {
			r0, r1 := bi*blockRows, min(rows, (bi+1)*blockRows)
			c0, c1 := bj*blockCols, min(cols, (bj+1)*blockCols)
			var amax float32
			for r := r0; r < r1; r++ {
				a, ok := AbsMax(w[r*cols+c0 : r*cols+c1])
				if !ok {
					return nil, fmt.Errorf("quantize fp8 block: row %d: %w", r, ErrNonFinite)
				}
				amax = max(amax, a)
			}
			s := amax / E4M3Max
			i := bi*sc + bj
			if sd == ScaleE8M0 {
				m.Scales[i] = pow2Ceil(s)
				s = E8M0ToFloat32(m.Scales[i])
			} else {
				if s == 0 {
					s = 1
				}
				binary.LittleEndian.PutUint32(m.Scales[4*i:], math.Float32bits(s))
			}
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					m.Data[r*cols+c] = Float32ToE4M3(w[r*cols+c] / s)
				}
			}
		}
	}
	return m, nil
}
