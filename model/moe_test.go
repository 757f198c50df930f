package model

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// Tests of DeepSeek-V3 (deepseek_v3.go) and Qwen3-MoE (qwen3_moe.go) that
// need no fixture: small random checkpoints in the released layouts
// (internal/testmodel), checked against equivalent checkpoints the other
// code paths run. TestGolden checks them against transformers when the
// fixture set holds deepseek_v3 and qwen3_moe folders
// (testdata/gen_moe_fixtures.py writes them).

// tinyV3 is a small DeepSeek-V3 in the released FP8 layout: widths that are
// not multiples of the 128 block (partial edge tiles) and a kv_a_proj split
// inside a block.
var tinyV3 = testmodel.DeepseekV3{Layers: 3, DenseLayers: 1, Hidden: 160, FFN: 200, Heads: 2, Vocab: 96,
	QLora: 48, KVLora: 40, Nope: 16, Rope: 8, VDim: 24, Experts: 8, Shared: 1, TopK: 2, MoEFFN: 40,
	Groups: 4, TopKGroups: 2, FP8: true, Seed: 3}

// tinyV3Aligned splits kv_a_proj_with_mqa at a block edge (kv_lora_rank
// 128), as the released 512 does: the parts keep their FP8 blocks.
var tinyV3Aligned = func() testmodel.DeepseekV3 { d := tinyV3; d.KVLora = 128; return d }()

// tinyQwen3MoE is a small Qwen3-MoE in float32.
var tinyQwen3MoE = testmodel.Qwen3MoE{Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 80,
	FFN: 96, Experts: 6, TopK: 2, MoEFFN: 32, DType: weights.F32, Seed: 4}

func writeTiny(t *testing.T, m testmodel.Model) string {
	t.Helper()
	dir := t.TempDir()
	if err := m.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rewrite copies the checkpoint src into a new folder: config.json with
// the fields of cfg set (a nil value deletes the field), each tensor
// through edit, which returns the tensors to write in its place (none drops
// it).
func rewrite(t *testing.T, src string, cfg map[string]any, edit func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor) string {
	t.Helper()
	dst := t.TempDir()
	if err := testmodel.RewriteTensors(src, dst, edit); err != nil {
		t.Fatal(err)
	}
	for _, field := range slices.Sorted(maps.Keys(cfg)) {
		editConfig(t, dst, field, cfg[field])
	}
	return dst
}

func keep(_ *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor { return []*weights.Tensor{tn} }

// dequantized is edit for rewrite: each FP8 weight as the float32 values
// e4m3 × weight_scale_inv (DeepSeek's weight_dequant), its scale dropped.
func dequantized(t *testing.T) func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
	return func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		if strings.HasSuffix(tn.Name, ".weight_scale_inv") {
			return nil
		}
		if tn.DType != weights.F8E4M3 {
			return []*weights.Tensor{tn}
		}
		s, err := ck.Tensor(strings.TrimSuffix(tn.Name, "weight") + "weight_scale_inv")
		if err != nil {
			t.Fatal(err)
		}
		q, err := quant.NewFP8Block(tn.Shape[0], tn.Shape[1], 128, 128, tn.Data, s.Data, quant.ScaleF32)
		if err != nil {
			t.Fatal(err)
		}
		return []*weights.Tensor{{Name: tn.Name, DType: weights.F32, Shape: tn.Shape, Data: f32Bytes(q.Dequantize())}}
	}
}

// logitsOf is runLogits of the model in dir.
func logitsOf(t *testing.T, dir string, ids []int32, P int) (full, inc []float32) {
	m := loadTestModel(t, dir)
	return runLogits(t, m, m.NewState, ids, P)
}

func testIDs(vocab, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32((i*37 + 11) % vocab)
	}
	return ids
}

// TestMoEEquivalents runs each released layout against a checkpoint that
// another, already-tested path runs and that computes the same function:
// DeepSeek-V3's FP8 against its float32 dequantization; Qwen3-MoE whose
// experts are all one MLP against the dense Qwen3 of that MLP (the routed
// weights sum to 1 under norm_topk_prob). Full and incremental logits must
// agree, and the incremental ones with the full.
func TestMoEEquivalents(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model testmodel.Model
		vocab int
		// pair returns the checkpoint under test, made from the written
		// one, and the equivalent reference.
		pair func(t *testing.T, dir string) (test, ref string)
		tol  float64
	}{
		{"deepseek_v3 fp8 = dequantized f32", tinyV3, tinyV3.Vocab, func(t *testing.T, dir string) (string, string) {
			return dir, rewrite(t, dir, map[string]any{"quantization_config": nil}, dequantized(t))
		}, 1e-5},
		{"deepseek_v3 fp8 with kv_a_proj split at a block edge", tinyV3Aligned, tinyV3.Vocab, func(t *testing.T, dir string) (string, string) {
			return dir, rewrite(t, dir, map[string]any{"quantization_config": nil}, dequantized(t))
		}, 1e-5},
		{"qwen3_moe of identical experts = qwen3", tinyQwen3MoE, tinyQwen3MoE.Vocab, func(t *testing.T, dir string) (string, string) {
			moe := identicalExperts(t, dir)
			return moe, denseOf(t, moe)
		}, 1e-4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			test, ref := tc.pair(t, writeTiny(t, tc.model))
			ids, P, V := testIDs(tc.vocab, 12), 5, tc.vocab
			full, inc := logitsOf(t, test, ids, P)
			wantFull, wantInc := logitsOf(t, ref, ids, P)
			for _, v := range full {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("non-finite logit %v", v)
				}
			}
			if d := maxAbsDiff(full, wantFull); d > tc.tol {
				t.Errorf("full logits: max |diff| %.3g > %g", d, tc.tol)
			}
			if d := maxAbsDiff(inc, wantInc); d > tc.tol {
				t.Errorf("incremental logits: max |diff| %.3g > %g", d, tc.tol)
			}
			if d := maxAbsDiff(inc, full[(P-1)*V:]); d > 1e-4 {
				t.Errorf("incremental against full: max |diff| %.3g", d)
			}
		})
	}
}

// identicalExperts rewrites a Qwen3-MoE checkpoint so that every expert of
// a layer is its expert 0.
func identicalExperts(t *testing.T, dir string) string {
	return rewrite(t, dir, nil, func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		if e, ok := expertOf(tn.Name); ok && e != "0" {
			src, err := ck.Tensor(strings.Replace(tn.Name, ".experts."+e+".", ".experts.0.", 1))
			if err != nil {
				t.Fatal(err)
			}
			return []*weights.Tensor{{Name: tn.Name, DType: src.DType, Shape: src.Shape, Data: src.Data}}
		}
		return []*weights.Tensor{tn}
	})
}

// denseOf is the Qwen3 whose MLP is expert 0 of the Qwen3-MoE in dir.
func denseOf(t *testing.T, dir string) string {
	return rewrite(t, dir, map[string]any{"model_type": "qwen3", "intermediate_size": tinyQwen3MoE.MoEFFN}, func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		switch e, ok := expertOf(tn.Name); {
		case ok && e == "0":
			name := strings.Replace(tn.Name, ".experts.0.", ".", 1)
			return []*weights.Tensor{{Name: name, DType: tn.DType, Shape: tn.Shape, Data: tn.Data}}
		case ok, strings.HasSuffix(tn.Name, ".mlp.gate.weight"):
			return nil
		}
		return []*weights.Tensor{tn}
	})
}

// expertOf returns the expert number of a routed expert's tensor name.
func expertOf(name string) (string, bool) {
	_, rest, ok := strings.Cut(name, ".mlp.experts.")
	if !ok {
		return "", false
	}
	e, _, _ := strings.Cut(rest, ".")
	return e, true
}

// TestMoEBadInput checks that a damaged released checkpoint fails at load
// with an error naming the tensor at fault, classified for errors.Is.
func TestMoEBadInput(t *testing.T) {
	v3 := writeTiny(t, tinyV3)
	qw := writeTiny(t, tinyQwen3MoE)
	const scale = "model.layers.1.self_attn.q_b_proj.weight_scale_inv"
	for _, tc := range []struct {
		name, dir, tensor string
		edit              func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor
		want              error
	}{
		{"scale of the wrong shape", v3, scale, func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
			if tn.Name == scale {
				return []*weights.Tensor{{Name: tn.Name, DType: tn.DType, Shape: []int{tn.Shape[0] * tn.Shape[1]}, Data: tn.Data}}
			}
			return []*weights.Tensor{tn}
		}, nvfp4ckpt.ErrBadTensor},
		{"scale of the wrong dtype", v3, scale, func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
			if tn.Name == scale {
				return []*weights.Tensor{{Name: tn.Name, DType: weights.BF16, Shape: tn.Shape, Data: tn.Data[:len(tn.Data)/2]}}
			}
			return []*weights.Tensor{tn}
		}, nvfp4ckpt.ErrUnsupportedDType},
		{"scale missing", v3, "q_b_proj.scale (or .weight_scale_inv)", dropTensor(scale), nvfp4ckpt.ErrMissingScale},
		{"deepseek_v3 expert missing", v3, "model.layers.2.mlp.experts.5.up_proj.weight",
			dropTensor("model.layers.2.mlp.experts.5.up_proj.weight"), weights.ErrMissingTensor},
		{"qwen3_moe expert missing", qw, "model.layers.1.mlp.experts.3.down_proj.weight",
			dropTensor("model.layers.1.mlp.experts.3.down_proj.weight"), weights.ErrMissingTensor},
		{"qwen3_moe router missing", qw, "model.layers.0.mlp.gate.weight",
			dropTensor("model.layers.0.mlp.gate.weight"), weights.ErrMissingTensor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(rewrite(t, tc.dir, nil, tc.edit))
			if err == nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.tensor) {
				t.Errorf("error %v, want one wrapping %v and naming %s", err, tc.want, tc.tensor)
			}
		})
	}
}

func dropTensor(name string) func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
	return func(ck *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		if tn.Name == name {
			return nil
		}
		return []*weights.Tensor{tn}
	}
}

// TestMoEConfigErrors checks the fields the MoE architectures refuse, each
// error naming its field.
func TestMoEConfigErrors(t *testing.T) {
	v3 := writeTiny(t, tinyV3)
	qw := writeTiny(t, tinyQwen3MoE)
	for _, tc := range []struct {
		dir, field string
		value      any
	}{
		{v3, "moe_layer_freq", 2},
		{v3, "topk_method", "greedy"},
		{v3, "scoring_func", "softmax"},
		{v3, "q_lora_rank", json.RawMessage("null")},
		{qw, "decoder_sparse_step", 0},
		{qw, "mlp_only_layers", []int{7}},
		{qw, "num_experts_per_tok", 9},
		{qw, "num_local_experts", 3}, // transformers 5's name for num_experts, contradicting it
	} {
		t.Run(tc.field, func(t *testing.T) {
			dir := rewrite(t, tc.dir, map[string]any{tc.field: tc.value}, keep)
			_, err := load(dir)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"`+tc.field+`"`) {
				t.Errorf("error %v, want ErrConfig naming %q", err, tc.field)
			}
		})
	}
}

// TestQwen3MoEDenseLayers checks mlp_only_layers and decoder_sparse_step:
// the layers they make dense need the dense MLP (its absence is the error
// naming mlp.gate_proj), the others the experts.
func TestQwen3MoEDenseLayers(t *testing.T) {
	qw := writeTiny(t, tinyQwen3MoE)
	for _, tc := range []struct {
		field string
		value any
	}{{"mlp_only_layers", []int{1}}, {"decoder_sparse_step", 2}} {
		dir := rewrite(t, qw, map[string]any{tc.field: tc.value}, keep)
		_, err := load(dir)
		if !errors.Is(err, weights.ErrMissingTensor) || !strings.Contains(err.Error(), "model.layers.0.mlp.gate_proj.weight") &&
			!strings.Contains(err.Error(), "model.layers.1.mlp.gate_proj.weight") {
			t.Errorf("%s %v: error %v, want the missing dense MLP named", tc.field, tc.value, err)
		}
	}
}

// TestDeepseekV3IsV32WithoutIndexer loads each deepseek_v32 fixture as
// deepseek_v3 (its indexer tensors then unread) and checks it against
// DeepSeek-V3.2's dense MLA path, which attends to every earlier token as
// V3 does.
func TestDeepseekV3IsV32WithoutIndexer(t *testing.T) {
	for _, dir := range v32Dirs(t) {
		ref := golden.Load(t, dir)
		ids, P := ref.InputIDs, prefillLen(t, dir, ref)
		v32, err := loadV32(t, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		v3, err := loadV32(t, dir, func(c map[string]any) { c["model_type"], c["layer_types"] = "deepseek_v3", nil })
		if err != nil {
			t.Fatal(err)
		}
		const ik = "model.layers.0.self_attn.indexer.wk.weight"
		if _, err := load(rewrite(t, dir, nil, dropTensor(ik))); !errors.Is(err, weights.ErrMissingTensor) || !strings.Contains(err.Error(), ik) {
			t.Errorf("%s without %s: error %v, want the missing tensor named", dir, ik, err)
		}
		if _, err := v3.NewStateWith(4, MLANaive); err == nil {
			t.Errorf("%s: deepseek_v3 gave a naive (indexer) state", dir)
		}
		wantFull, wantInc := runV32(t, v32, MLADense, ids, P)
		full, inc := runV32(t, v3, MLADense, ids, P)
		if d := max(maxAbsDiff(full, wantFull), maxAbsDiff(inc, wantInc)); d != 0 {
			t.Errorf("%s: deepseek_v3 against deepseek_v32's dense path: max |diff| %g", dir, d)
		}
		full, inc = runV32(t, v3, MLAAbsorbed, ids, P)
		if d := max(maxAbsDiff(full, wantFull), maxAbsDiff(inc, wantInc)); d > 1e-4 {
			t.Errorf("%s: deepseek_v3's latent attention against the dense path: max |diff| %g", dir, d)
		} else {
			t.Logf("%s: deepseek_v3's latent attention against the dense path: max |diff| %.3g", dir, d)
		}
	}
}

// TestDeepseekV3Paths checks DeepSeek-V3's two attention paths on the
// released FP8 layout: the latent one (NewState's) against the expanded
// keys and values, and what each caches a token.
func TestDeepseekV3Paths(t *testing.T) {
	m := loadTestModel(t, writeTiny(t, tinyV3)).(*DeepseekV32)
	ids := testIDs(tinyV3.Vocab, 12)
	wantFull, wantInc := runV32(t, m, MLADense, ids, 5)
	full, inc := runV32(t, m, MLAAbsorbed, ids, 5)
	if d := max(maxAbsDiff(full, wantFull), maxAbsDiff(inc, wantInc)); d > 1e-4 {
		t.Errorf("latent against dense attention: max |diff| %g", d)
	}
	a, L := m.MLAShape(), int64(tinyV3.Layers)
	for _, tc := range []struct {
		path MLAPath
		want int64
	}{
		{MLAAuto, L * 2 * int64(a.KVLoraRank+a.RopeDim) * 4},
		{MLADense, L * 2 * int64(a.Heads*a.QKDim()) * 4},
	} {
		st, err := m.NewStateWith(8, tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CacheBytesPerToken(); got != tc.want {
			t.Errorf("%v: %d cache bytes a token, want %d", tc.path, got, tc.want)
		}
	}
}

// TestDeepseekV3ForwardDevice checks that ForwardDevice (the logits left on
// the backend, for a backend that samples there) gives Forward's logits, bit
// for bit, for a prompt run in passes of 3 rows and for the decode steps
// after it.
func TestDeepseekV3ForwardDevice(t *testing.T) {
	m := loadTestModel(t, writeTiny(t, tinyV3)).(*DeepseekV32)
	m.maxChunk = 3
	ctx := context.Background()
	ids := testIDs(tinyV3.Vocab, 10)
	host, err := m.NewState(len(ids))
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := m.NewState(len(ids))
	for _, run := range [][]int32{ids[:7], ids[7:8], ids[8:9], ids[9:]} {
		want, err := m.Forward(ctx, host, run, false)
		if err != nil {
			t.Fatal(err)
		}
		buf, err := m.ForwardDevice(ctx, dev, run)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, buf.Len())
		m.b.Read(got, buf, 0)
		if !slices.Equal(got, want) || dev.Len() != host.Len() {
			t.Fatalf("after %d tokens: ForwardDevice's logits (state of %d) differ from Forward's (state of %d)", host.Len(), dev.Len(), host.Len())
		}
	}
}

// TestMoEConfigFieldEdges sets every config.json field of the released MoE
// layouts to edge values: each must give an error or finite logits, never
// a panic.
func TestMoEConfigFieldEdges(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	checkFieldEdges(t, writeTiny(t, tinyV3), writeTiny(t, tinyQwen3MoE))
}
