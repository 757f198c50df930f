package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// e4m3Ref is a brute-force reference encoder: the nearest finite E4M3 value,
// ties to the even code, saturating to ±448.
func e4m3Ref(f float32) uint8 {
	if f != f {
		return E4M3NaN
	}
	x := float64(f)
	if x >= E4M3Max {
		return 0x7e
	}
	if x <= -E4M3Max {
		return 0xfe
	}
	best, bestD := uint8(0), math.Inf(1)
	for c := 0; c < 256; c++ {
		if c&0x7f == 0x7f {
			continue
		}
		v := float64(E4M3ToFloat32(uint8(c)))
		if math.Signbit(v) != math.Signbit(x) && v != 0 {
			continue
		}
		d := math.Abs(v - x)
		if d < bestD || (d == bestD && c&1 == 0 && best&1 == 1) {
			best, bestD = uint8(c), d
		}
	}
	if x == 0 || (best&0x7f == 0) { // keep the sign of zero
		if math.Signbit(x) {
			return 0x80
		}
		return 0
	}
	return best
}

func TestE4M3Values(t *testing.T) {
	tests := []struct {
		code uint8
		want float32
	}{
		{0x00, 0}, {0x80, float32(math.Copysign(0, -1))},
		{0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64},
		{0x38, 1}, {0xb8, -1}, {0x3c, 1.5}, {0x40, 2},
		{0x7e, 448}, {0xfe, -448}, {0x7d, 416},
	}
	for _, tt := range tests {
		got := E4M3ToFloat32(tt.code)
		if got != tt.want || math.Signbit(float64(got)) != math.Signbit(float64(tt.want)) {
			t.Errorf("E4M3ToFloat32(%#02x) = %v, want %v", tt.code, got, tt.want)
		}
	}
}

func TestFloat32ToE4M3MatchesReference(t *testing.T) {
	// Every midpoint between adjacent codes, its neighbours, and random values.
	var in []float32
	for c := 0; c < 0x7e; c++ {
		lo, hi := float64(E4M3ToFloat32(uint8(c))), float64(E4M3ToFloat32(uint8(c+1)))
		mid := float32((lo + hi) / 2)
		in = append(in, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000), -mid)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		in = append(in, math.Float32frombits(r.Uint32()), float32(r.NormFloat64()*100))
	}
	for _, f := range in {
		if got, want := Float32ToE4M3(f), e4m3Ref(f); got != want {
			t.Fatalf("Float32ToE4M3(%v [%#08x]) = %#02x, reference %#02x", f, math.Float32bits(f), got, want)
		}
	}
}

// Block-scaled formats: E8M0, FP8 with tile scales, MXFP4.

func TestE8M0(t *testing.T) {
	for _, c := range []struct {
		code uint8
		want float64
	}{{0, math.Ldexp(1, -127)}, {1, math.Ldexp(1, -126)}, {120, 1.0 / 128}, {127, 1}, {128, 2}, {254, math.Ldexp(1, 127)}} {
		if got := E8M0ToFloat32(c.code); float64(got) != c.want {
			t.Errorf("E8M0ToFloat32(%d) = %g, want %g", c.code, got, c.want)
		}
	}
	if !math.IsNaN(float64(E8M0ToFloat32(E8M0NaN))) {
		t.Error("E8M0ToFloat32(0xff) is not NaN")
	}
	for c := range 255 {
		if got, ok := Float32ToE8M0(E8M0ToFloat32(uint8(c))); !ok || got != uint8(c) {
			t.Errorf("Float32ToE8M0(E8M0ToFloat32(%d)) = %d, %v", c, got, ok)
		}
	}
	for _, f := range []float32{0, -1, 3, 1.5, float32(math.Inf(1)), float32(math.NaN())} {
		if _, ok := Float32ToE8M0(f); ok {
			t.Errorf("Float32ToE8M0(%g) ok, want not a power of two", f)
		}
	}
}

// randBlocky is a rows x cols matrix whose 32-element blocks have magnitudes
// spread over octaves octaves.
func randBlocky(rng *rand.Rand, rows, cols, octaves int) []float32 {
	w := make([]float32, rows*cols)
	for b := 0; b < len(w); b += 32 {
		s := math.Ldexp(1, rng.IntN(octaves+1)-octaves/2)
		for j := b; j < min(len(w), b+32); j++ {
			w[j] = float32(rng.NormFloat64() * s)
		}
	}
	return w
}

func TestFP8BlockRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		rows, cols, br, bc int
		sd                 ScaleDType
	}{{256, 384, 128, 128, ScaleE8M0}, {200, 130, 128, 128, ScaleE8M0}, {200, 130, 128, 128, ScaleF32}, {64, 96, 32, 32, ScaleE8M0}, {5, 7, 128, 128, ScaleF32}} {
		w := randBlocky(rng, c.rows, c.cols, 6)
		m, err := QuantizeFP8Block(w, c.rows, c.cols, c.br, c.bc, c.sd)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		sr, sc := m.ScaleShape()
		if len(m.Scales) != sr*sc*c.sd.Size() || sr != (c.rows+c.br-1)/c.br || sc != (c.cols+c.bc-1)/c.bc {
			t.Fatalf("%+v: scale shape [%d, %d], %d bytes", c, sr, sc, len(m.Scales))
		}
		d := m.Dequantize()
		for i, v := range d {
			r, k := i/c.cols, i%c.cols
			if want := E4M3ToFloat32(m.Data[i]) * m.Scale(r, k); v != want {
				t.Fatalf("%+v: [%d, %d] = %g, want e4m3*scale %g", c, r, k, v, want)
			}
			// E4M3 keeps 3 mantissa bits: relative error <= 1/16 above the
			// subnormals, absolute <= half a subnormal step below.
			if e := math.Abs(float64(v - w[i])); e > math.Abs(float64(w[i]))/16+float64(m.Scale(r, k))/1024 {
				t.Fatalf("%+v: [%d, %d] = %g, quantized from %g", c, r, k, v, w[i])
			}
		}
	}
}

// TestFP8BlockPartialTileRows pins DeepSeek's tiling where a dimension is
// not a multiple of the block: scale row i covers rows [128i, 128i+128), the
// last tile short. V4's grouped wo_a at o_groups*o_lora = 192 has a [2, 1]
// grid; transformers 5.17's CPU dequant derives the block from the grid
// (192/2 = 96 rows) and scales rows 96..127 by the second tile's scale
// (model/testdata/gen_v4_released.py, TF_GRID_BLOCKS). Columns likewise.
func TestFP8BlockPartialTileRows(t *testing.T) {
	one := byte(0x38)             // E4M3 1.0
	tile := func(i int) float32 { // scale of the tile holding index i
		if i < 128 {
			return 0.5
		}
		return 1
	}
	for _, c := range []struct {
		rows, cols int
		scales     []byte // E8M0: 126 = 0.5, 127 = 1
		want       func(r, k int) float32
	}{
		{192, 128, []byte{126, 127}, func(r, _ int) float32 { return tile(r) }},
		{128, 192, []byte{126, 127}, func(_, k int) float32 { return tile(k) }},
	} {
		data := make([]byte, c.rows*c.cols)
		for i := range data {
			data[i] = one
		}
		m, err := NewFP8Block(c.rows, c.cols, 128, 128, data, c.scales, ScaleE8M0)
		if err != nil {
			t.Fatal(err)
		}
		d := m.Dequantize()
		for i, v := range d {
			if r, k := i/c.cols, i%c.cols; v != c.want(r, k) {
				t.Fatalf("%dx%d: [%d, %d] = %g, want %g", c.rows, c.cols, r, k, v, c.want(r, k))
			}
		}
	}
}

func TestFP8BlockValidate(t *testing.T) {
	good := func() *FP8Block {
		return &FP8Block{Rows: 130, Cols: 200, BlockRows: 128, BlockCols: 128, Data: make([]byte, 130*200), Scales: []byte{127, 127, 127, 127}, ScaleDType: ScaleE8M0}
	}
	nan := good()
	nan.Scales[3] = E8M0NaN
	neg := good()
	neg.ScaleDType, neg.Scales = ScaleF32, make([]byte, 16)
	binary.LittleEndian.PutUint32(neg.Scales[4:], math.Float32bits(-1))
	for _, c := range []struct {
		name string
		m    *FP8Block
		want error
	}{
		{"ok", good(), nil},
		{"short scales", &FP8Block{Rows: 130, Cols: 200, BlockRows: 128, BlockCols: 128, Data: make([]byte, 130*200), Scales: []byte{1, 2}, ScaleDType: ScaleE8M0}, ErrScale},
		{"f32 count as e8m0", &FP8Block{Rows: 130, Cols: 200, BlockRows: 128, BlockCols: 128, Data: make([]byte, 130*200), Scales: make([]byte, 4), ScaleDType: ScaleF32}, ErrScale},
		{"unknown scale type", &FP8Block{Rows: 1, Cols: 1, BlockRows: 128, BlockCols: 128, Data: make([]byte, 1), Scales: make([]byte, 1)}, ErrScale},
		{"short data", &FP8Block{Rows: 2, Cols: 2, BlockRows: 128, BlockCols: 128, Data: make([]byte, 3), Scales: make([]byte, 1), ScaleDType: ScaleE8M0}, ErrShape},
		{"nan scale", nan, ErrNonFinite},
		{"negative scale", neg, ErrNonFinite},
	} {
		if err := c.m.Validate(); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Validate() = %v, want %v", c.name, err, c.want)
		}
	}
}

func TestMXFP4Decode(t *testing.T) {
	// Row 0: block 0 scale 2^0 holds codes 1..15,0 repeated; block 1 scale
	// 2^-3. Element 2j is the low nibble of byte j.
	m := &MXFP4{Rows: 1, Cols: 64, Packed: make([]byte, 32), Scales: []byte{127, 124}}
	for j := range 32 {
		m.Packed[j] = uint8(2*j%16) | uint8((2*j+1)%16)<<4
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	d := m.Dequantize()
	for k, v := range d {
		s := float32(1)
		if k >= 32 {
			s = 1.0 / 8
		}
		if want := E2M1ToFloat32(uint8(k%16)) * s; v != want {
			t.Fatalf("element %d = %g, want %g", k, v, want)
		}
	}
	for _, c := range []struct {
		name string
		m    *MXFP4
		want error
	}{
		{"K not /32", &MXFP4{Rows: 1, Cols: 48, Packed: make([]byte, 24), Scales: make([]byte, 1)}, ErrShape},
		{"short packed", &MXFP4{Rows: 1, Cols: 32, Packed: make([]byte, 15), Scales: make([]byte, 1)}, ErrShape},
		{"scale per 16", &MXFP4{Rows: 1, Cols: 32, Packed: make([]byte, 16), Scales: make([]byte, 2)}, ErrScale},
		{"nan scale", &MXFP4{Rows: 1, Cols: 32, Packed: make([]byte, 16), Scales: []byte{E8M0NaN}}, ErrNonFinite},
	} {
		if err := c.m.Validate(); !errors.Is(err, c.want) {
			t.Errorf("%s: Validate() = %v, want %v", c.name, err, c.want)
		}
	}
}

// TestMXFP4ToNVFP4Lossless holds the re-blocking to bit-exact equality of
// the dequantized matrices, for scale spreads up to the 17 octaves NVFP4's
// E4M3 block scales hold, with all-zero blocks and extreme exponents; one
// more octave is refused.
func TestMXFP4ToNVFP4Lossless(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name       string
		rows, cols int
		octaves    int
		base       int // added to every E8M0 code
		zeroBlocks bool
		want       error
	}{
		{"typical", 64, 256, 6, 0, false, nil},
		{"17 octaves", 32, 1024, 17, 0, false, nil},
		{"zero blocks", 16, 512, 10, 0, true, nil},
		{"tiny exponents", 8, 128, 17, -100, false, nil},
		{"huge exponents", 8, 128, 17, 100, false, nil},
		{"18 octaves", 32, 1024, 18, 0, false, ErrNotLossless},
	} {
		m, err := QuantizeMXFP4(randBlocky(rng, c.rows, c.cols, 2), c.rows, c.cols)
		if err != nil {
			t.Fatal(err)
		}
		// Set the scales directly to span exactly c.octaves octaves.
		for i := range m.Scales {
			m.Scales[i] = uint8(120 + c.base + rng.IntN(c.octaves+1))
		}
		m.Scales[0], m.Scales[1] = uint8(120+c.base), uint8(120+c.base+c.octaves)
		if m.blockZero(0) || m.blockZero(1) {
			t.Fatal("extreme blocks are zero")
		}
		if c.zeroBlocks {
			for b := 2; b < len(m.Scales); b += 3 {
				clear(m.Packed[b*16 : (b+1)*16])
				m.Scales[b] = uint8(rng.IntN(255)) // any scale: the block is zero
			}
		}
		q, err := m.ToNVFP4()
		if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
			t.Fatalf("%s: ToNVFP4() = %v, want %v", c.name, err, c.want)
		}
		if err != nil {
			continue
		}
		if err := q.Validate(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want, got := m.Dequantize(), q.Dequantize()
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) && !(want[i] == 0 && got[i] == 0) {
				t.Fatalf("%s: element %d: nvfp4 %g, mxfp4 %g", c.name, i, got[i], want[i])
			}
		}
	}
}

func TestQuantizeMXFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	w := randBlocky(rng, 16, 128, 8)
	m, err := QuantizeMXFP4(w, 16, 128)
	if err != nil {
		t.Fatal(err)
	}
	d := m.Dequantize()
	for i := range w {
		s := E8M0ToFloat32(m.Scales[i/32])
		// E2M1 steps are at most 2 (between 4 and 6) in units of the scale;
		// amax/scale is in (3, 6].
		if e := math.Abs(float64(d[i] - w[i])); e > float64(s) {
			t.Fatalf("element %d: %g quantized to %g (scale %g)", i, w[i], d[i], s)
		}
	}
	if _, err := QuantizeMXFP4(w[:100], 1, 100); !errors.Is(err, ErrShape) {
		t.Errorf("K=100: %v, want ErrShape", err)
	}
}
