package quant

import (
	"bytes"
	"testing"
)

// TestSwizzleOffsetHandWorked checks seed 004's formula
//
//	mTile*(numKTiles*512) + kTile*512 + (row%32)*16 + ((row%128)/32)*4 + col%4
//
// on cases worked out by hand.
func TestSwizzleOffsetHandWorked(t *testing.T) {
	tests := []struct {
		row, col, cols int
		want           int
	}{
		// 130 rows x 5 scale columns pad to 256 x 8: numKTiles = 2.
		// (129, 4): mTile 1 -> 1*2*512 = 1024; kTile 1 -> +512; 129%32 = 1 -> +16;
		// (129%128)/32 = 0; 4%4 = 0. Total 1552.
		{129, 4, 5, 1552},
		// (45, 2): mTile 0, kTile 0; 45%32 = 13 -> 208; 45/32 = 1 -> +4; +2. Total 214.
		{45, 2, 5, 214},
		// (0, 0) is the first byte; (1, 0) is 16 bytes on (row%32 stride).
		{0, 0, 5, 0},
		{1, 0, 5, 16},
		// (32, 0): second group of 32 rows inside the tile -> innerM stride 4.
		{32, 0, 5, 4},
		// (127, 3): 31*16 + 3*4 + 3 = 511, the last byte of the first 512-byte atom.
		{127, 3, 5, 511},
		// K = 4096: 256 scale columns, numKTiles = 64. (300, 255): mTile 2 -> 2*64*512 = 65536;
		// kTile 63 -> 32256; 300%32 = 12 -> 192; (300%128)/32 = 1 -> 4; 255%4 = 3. Total 97991.
		{300, 255, 256, 97991},
	}
	for _, tt := range tests {
		if got := SwizzleOffset(tt.row, tt.col, tt.cols); got != tt.want {
			t.Errorf("SwizzleOffset(%d, %d, cols %d) = %d, want %d", tt.row, tt.col, tt.cols, got, tt.want)
		}
	}
}

func TestSwizzleRoundTrip(t *testing.T) {
	shapes := [][2]int{{1, 1}, {1, 4}, {3, 5}, {127, 3}, {128, 4}, {130, 5}, {300, 17}, {256, 256}}
	for _, sh := range shapes {
		rows, cols := sh[0], sh[1]
		plain := make([]byte, rows*cols)
		for i := range plain {
			plain[i] = byte(i*7+1) | 1 // never zero, so padding is told apart
		}
		swz := SwizzleScales(plain, rows, cols)
		pr, pc := SwizzledScaleShape(rows, cols)
		if len(swz) != pr*pc || pr%128 != 0 || pc%4 != 0 || pr < rows || pc < cols || pr-rows >= 128 || pc-cols >= 4 {
			t.Fatalf("%dx%d: swizzled %d bytes, padded shape %dx%d", rows, cols, len(swz), pr, pc)
		}
		nonzero := 0
		for _, b := range swz {
			if b != 0 {
				nonzero++
			}
		}
		if nonzero != rows*cols {
			t.Errorf("%dx%d: %d non-zero bytes in the swizzled layout, want %d (padding must be zero)", rows, cols, nonzero, rows*cols)
		}
		for r := range rows {
			for c := range cols {
				if got, want := swz[SwizzleOffset(r, c, cols)], plain[r*cols+c]; got != want {
					t.Fatalf("%dx%d: swizzled[offset(%d,%d)] = %d, want %d", rows, cols, r, c, got, want)
				}
			}
		}
		back, err := UnswizzleScales(swz, rows, cols)
		if err != nil {
			t.Fatalf("%dx%d: %v", rows, cols, err)
		}
		if !bytes.Equal(back, plain) {
			t.Errorf("%dx%d: unswizzle(swizzle(x)) != x", rows, cols)
		}
		// Swizzle is a bijection on the padded matrix: swizzling the unswizzled
		// bytes of the padded matrix gives the same bytes back.
		if again := SwizzleScales(back, rows, cols); !bytes.Equal(again, swz) {
			t.Errorf("%dx%d: swizzle(unswizzle(y)) != y", rows, cols)
		}
	}
}

func TestUnswizzleBadSize(t *testing.T) {
	if _, err := UnswizzleScales(make([]byte, 100), 130, 5); err == nil {
		t.Error("UnswizzleScales accepted 100 bytes for a 130x5 matrix (needs 256x8)")
	}
}
