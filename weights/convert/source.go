package convert

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// linearNames are the last components of module names whose 2-D ".weight"
// is a linear layer of attention, MLP or experts: Llama/Qwen/Mistral
// (q_proj ... down_proj), fused variants, DeepSeek V2/V3/V3.2 MLA (q_a_proj,
// kv_b_proj, indexer wq_b and wk), DeepSeek-V4's original names (wq_a, wq_b,
// wkv, wo_a, wo_b; experts and shared experts w1, w2, w3) and GPT-style
// fc1/fc2. Routers and gates (gate, wgate, weights_proj, router), embeddings
// and heads are not linears here and stay in BF16.
var linearNames = map[string]bool{
	"q_proj": true, "k_proj": true, "v_proj": true, "o_proj": true,
	"qkv_proj": true, "query_key_value": true, "out_proj": true, "in_proj": true,
	"gate_proj": true, "up_proj": true, "down_proj": true, "gate_up_proj": true,
	"fc1": true, "fc2": true, "c_fc": true, "c_proj": true, "c_attn": true,
	"q_a_proj": true, "q_b_proj": true, "kv_a_proj_with_mqa": true, "kv_b_proj": true,
	"wq": true, "wk": true, "wv": true, "wo": true,
	"wq_a": true, "wq_b": true, "wkv": true, "wkv_a": true, "wkv_b": true, "wo_a": true, "wo_b": true,
	"w1": true, "w2": true, "w3": true,
}

// scaleInvSuffix names DeepSeek's FP8 block scales: <module>.weight_scale_inv
// holds, for each weight block, the factor that multiplies the E4M3 values.
const scaleInvSuffix = "_scale_inv"

// kind is what the converter does with a tensor.
type kind int

const (
	kindQuantize kind = iota // linear weight -> NVFP4 (weight, weight_scale, weight_scale_2)
	kindBF16                 // float tensor -> BF16
	kindCopy                 // integer/bool tensor, copied as is
	kindConsumed             // FP8 weight_scale_inv (or V4's scale), folded into its weight
	kindReblock              // MXFP4 linear (DeepSeek-V4's routed experts) -> NVFP4 without rounding (mxfp4.go)
)

// isLinearWeight reports whether name/shape is a linear layer's weight by
// name (see linearNames) and returns its module name.
func isLinearWeight(name string, shape []int) (module string, ok bool) {
	if len(shape) != 2 || !strings.HasSuffix(name, ".weight") {
		return "", false
	}
	module = strings.TrimSuffix(name, ".weight")
	last := module[strings.LastIndexByte(module, '.')+1:]
	return module, linearNames[last]
}

// source is a stored tensor viewed as rows x cols float values (cols is the
// last dimension), with the FP8 block scales when it is FP8.
type source struct {
	t          *weights.Tensor
	rows, cols int
	scaleInv   []float32 // FP8: [sRows, sCols] block factors
	sCols      int
	blk        [2]int // FP8 block rows, cols
	extraBytes int64  // bytes of the consumed scale tensor, for progress
}

func newSource(t *weights.Tensor) *source {
	s := &source{t: t, rows: 1, cols: 1}
	if n := len(t.Shape); n > 0 {
		s.cols = t.Shape[n-1]
		for _, d := range t.Shape[:n-1] {
			s.rows *= d
		}
	}
	if s.cols == 0 {
		s.rows = 0
	}
	return s
}

// fp8ScaleName is the block-scale tensor of the FP8 weight name:
// DeepSeek-V3's <module>.weight_scale_inv, or V4's <module>.scale when the
// checkpoint has it.
func fp8ScaleName(c *weights.Checkpoint, name string) string {
	if module, ok := strings.CutSuffix(name, nvfp4ckpt.SuffixWeight); ok && c.Has(module+nvfp4ckpt.SuffixScale) {
		return module + nvfp4ckpt.SuffixScale
	}
	return name + scaleInvSuffix
}

// attachFP8Scales loads the block scales (weight_scale_inv, or V4's scale)
// of an FP8 weight.
func (s *source) attachFP8Scales(c *weights.Checkpoint, blk [2]int) error {
	name := fp8ScaleName(c, s.t.Name)
	if !c.Has(name) {
		return &weights.Error{File: s.t.File, Tensor: s.t.Name, Err: fmt.Errorf("%w %s (FP8 weights need their block scales)", nvfp4ckpt.ErrMissingScale, name)}
	}
	st, err := c.Tensor(name)
	if err != nil {
		return err
	}
	if len(s.t.Shape) != 2 {
		return &weights.Error{File: s.t.File, Tensor: s.t.Name, Err: fmt.Errorf("%w: FP8 weight of shape %v, want 2-D", nvfp4ckpt.ErrBadTensor, s.t.Shape)}
	}
	wantR, wantC := (s.rows+blk[0]-1)/blk[0], (s.cols+blk[1]-1)/blk[1]
	if len(st.Shape) != 2 || st.Shape[0] != wantR || st.Shape[1] != wantC {
		return &weights.Error{File: st.File, Tensor: st.Name, Err: fmt.Errorf("%w: block scales of shape %v, want [%d %d] for weight %v in %dx%d blocks",
			nvfp4ckpt.ErrBadTensor, st.Shape, wantR, wantC, s.t.Shape, blk[0], blk[1])}
	}
	switch st.DType {
	case weights.F32, weights.BF16, weights.F16, weights.F8E8M0:
	default:
		return &weights.Error{File: st.File, Tensor: st.Name, Err: fmt.Errorf("%w: block scales must be F32, BF16, F16 or F8_E8M0, got %s", nvfp4ckpt.ErrUnsupportedDType, st.DType)}
	}
	v, err := st.Float32()
	if err != nil {
		return err
	}
	s.scaleInv, s.sCols, s.blk, s.extraBytes = v, wantC, blk, int64(len(st.Data))
	return nil
}

// decodeRows writes rows [r0, r1) as float32 into dst[:(r1-r0)*cols].
func (s *source) decodeRows(dst []float32, r0, r1 int) {
	n := (r1 - r0) * s.cols
	dst = dst[:n]
	off := r0 * s.cols
	src := s.t.Data
	switch s.t.DType {
	case weights.F32:
		b := src[4*off : 4*(off+n)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case weights.BF16:
		quant.DecodeBF16(dst, src[2*off:])
	case weights.F16:
		quant.DecodeF16(dst, src[2*off:])
	case weights.F64:
		b := src[8*off : 8*(off+n)]
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
		}
	case weights.F8E4M3:
		quant.DecodeE4M3(dst, src[off:])
		if s.scaleInv == nil {
			return
		}
		for r := r0; r < r1; r++ {
			row := dst[(r-r0)*s.cols : (r-r0+1)*s.cols]
			srow := s.scaleInv[(r/s.blk[0])*s.sCols : (r/s.blk[0]+1)*s.sCols]
			for c0 := 0; c0 < s.cols; c0 += s.blk[1] {
				f := srow[c0/s.blk[1]]
				for i := c0; i < min(c0+s.blk[1], s.cols); i++ {
					row[i] *= f
				}
			}
		}
	default:
		panic("convert: decodeRows of " + s.t.DType.String()) // classify rejects these
	}
}

// absMaxRows returns the largest |value| of rows [r0, r1) and whether all
// are finite. BF16, F16 and F32 are scanned as bit patterns (magnitude bits
// order like the values), without decoding.
func (s *source) absMaxRows(r0, r1 int) (float32, bool) {
	off, n := r0*s.cols, (r1-r0)*s.cols
	src := s.t.Data
	switch s.t.DType {
	case weights.BF16, weights.F16:
		b := src[2*off : 2*(off+n)]
		var mx uint16
		for i := 0; i+1 < len(b); i += 2 {
			mx = max(mx, binary.LittleEndian.Uint16(b[i:])&0x7fff)
		}
		if s.t.DType == weights.BF16 {
			return quant.BF16ToFloat32(mx), mx < 0x7f80
		}
		return quant.F16ToFloat32(mx), mx < 0x7c00
	case weights.F32:
		b := src[4*off : 4*(off+n)]
		var mx uint32
		for i := 0; i+3 < len(b); i += 4 {
			mx = max(mx, binary.LittleEndian.Uint32(b[i:])&0x7fffffff)
		}
		return math.Float32frombits(mx), mx < 0x7f800000
	}
	chunk := s.rowChunk()
	buf := make([]float32, min(chunk, r1-r0)*s.cols)
	var mx float32
	ok := true
	for a := r0; a < r1; a += chunk {
		b := min(a+chunk, r1)
		s.decodeRows(buf, a, b)
		m, f := quant.AbsMax(buf[:(b-a)*s.cols])
		mx, ok = max(mx, m), ok && f
	}
	return mx, ok
}

// rowChunk returns how many rows to decode at a time so a chunk holds about
// 256K values.
func (s *source) rowChunk() int {
	return max(1, (1<<18)/max(s.cols, 1))
}

func isFloat(d weights.DType) bool {
	switch d {
	case weights.F32, weights.BF16, weights.F16, weights.F64, weights.F8E4M3:
		return true
	}
	return false
}

func isInteger(d weights.DType) bool {
	switch d {
	case weights.U8, weights.I8, weights.I16, weights.U16, weights.I32, weights.U32, weights.I64, weights.U64, weights.Bool:
		return true
	}
	return false
}
