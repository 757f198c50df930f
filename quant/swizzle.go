package quant

import "fmt"

// Block-scale layouts.
//
// An NVFP4 matrix of N rows and K columns has N x K/16 E4M3 block scales.
// Manifold keeps them plain row-major ([N, K/16], as ModelOpt stores
// weight_scale). The Blackwell block-scaled tensor-core GEMMs (CUTLASS, and
// LightX2V checkpoints written for them) want the swizzled layout of seed 004:
// rows padded to a multiple of 128, scale columns padded to a multiple of 4,
// and the padded [Rp, Cp] matrix stored as [Rp/128, Cp/4, 32, 4, 4]
// (mTile, kTile, row%32, (row%128)/32, col%4). Padding bytes are zero.

// SwizzleRowTile and SwizzleColTile are the padding multiples of the swizzled
// block-scale layout: 128 rows (32 x 4) and 4 scale columns.
const (
	SwizzleRowTile = 128
	SwizzleColTile = 4
)

// SwizzledScaleShape returns the padded shape [rows rounded up to 128, cols
// rounded up to 4] of the swizzled layout of a rows x cols block-scale matrix
// (cols = K/16).
func SwizzledScaleShape(rows, cols int) (paddedRows, paddedCols int) {
	return roundUp(rows, SwizzleRowTile), roundUp(cols, SwizzleColTile)
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// SwizzleOffset returns the byte offset of block scale (row, col) in the
// swizzled layout of a matrix with cols scale columns (K/16), following
// cvt_quant_to_fp4_get_sf_out_offset of seed 004:
//
//	mTile*(numKTiles*512) + kTile*512 + (row%32)*16 + ((row%128)/32)*4 + col%4
//
// with mTile = row/128, kTile = col/4 and numKTiles = ceil(cols/4).
func SwizzleOffset(row, col, cols int) int {
	numKTiles := (cols + SwizzleColTile - 1) / SwizzleColTile
	return (row/128)*numKTiles*512 + (col/4)*512 + (row%32)*16 + ((row%128)/32)*4 + col%4
}

// SwizzleScales returns the swizzled, zero-padded layout of the plain
// row-major rows x cols block scales in plain. It panics if plain is not
// rows*cols bytes long.
func SwizzleScales(plain []byte, rows, cols int) []byte {
	if rows < 0 || cols < 0 || len(plain) != rows*cols {
		panic(fmt.Sprintf("quant.SwizzleScales: %d bytes for a %dx%d scale matrix", len(plain), rows, cols))
	}
	pr, pc := SwizzledScaleShape(rows, cols)
	out := make([]byte, pr*pc)
	for r := range rows {
		row := plain[r*cols : (r+1)*cols]
		base := (r/128)*(pc/4)*512 + (r%32)*16 + ((r%128)/32)*4
		for c, v := range row {
			out[base+(c/4)*512+c%4] = v
		}
	}
	return out
}

// UnswizzleScales returns the plain row-major rows x cols block scales held
// in the swizzled layout swz. It returns an error if swz is not exactly the
// padded size (see SwizzledScaleShape).
func UnswizzleScales(swz []byte, rows, cols int) ([]byte, error) {
	if rows < 0 || cols < 0 {
		return nil, fmt.Errorf("quant: swizzled scales: bad shape %dx%d", rows, cols)
	}
	pr, pc := SwizzledScaleShape(rows, cols)
	if len(swz) != pr*pc {
		return nil, fmt.Errorf("quant: swizzled scales for %dx%d hold %d bytes, want %d (%dx%d padded)",
			rows, cols, len(swz), pr*pc, pr, pc)
	}
	out := make([]byte, rows*cols)
	for r := range rows {
		row := out[r*cols : (r+1)*cols]
		base := (r/128)*(pc/4)*512 + (r%32)*16 + ((r%128)/32)*4
		for c := range row {
			row[c] = swz[base+(c/4)*512+c%4]
		}
	}
	return out, nil
}
