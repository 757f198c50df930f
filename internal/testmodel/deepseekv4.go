package testmodel

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// DeepSeek-V4 layer kinds (config.json layer_types and mlp_layer_types).
const (
	V4Sliding = "sliding_attention"
	V4CSA     = "compressed_sparse_attention"
	V4HCA     = "heavily_compressed_attention"
	V4MoE     = "moe"
	V4HashMoE = "hash_moe"
)

// DeepseekV4 describes a DeepSeek-V4-shape model (model_type deepseek_v4, as
// model/deepseek_v4.go loads it) with random NVFP4 linears in ModelOpt's
// layout: the attention projections (wq_a, wq_b, wkv, the grouped wo_a,
// wo_b), the compressors' and the indexer's projections, the shared expert
// and every routed expert. The embedding table, the LM head (head.weight,
// untied), the RMS norm weights and the router (ffn.gate.weight) are bf16;
// the mHC parameters (hc_*_fn, base, scale, and model.hc_head.*), the
// attention sinks, the compressors' ape and the router bias are f32, as the
// reference computes them in f32.
//
// A zero field takes the value of transformers' DeepseekV4Config default
// (DeepSeek-V4-Flash: vocab 129280, hidden 4096, 43 layers, 64 heads of
// 512, q_lora 1024, 8 output groups of 1024, window 128, CSA rate 4 with a
// 64-head 128-wide indexer keeping 512 entries, HCA rate 128, hc_mult 4 with
// 20 Sinkhorn iterations, 256 routed experts of 2048, top 6, one shared
// expert, the first 3 MoE layers hash-routed). Both rotary embeddings are
// plain (no yarn) over the first 64 dims of each head.
type DeepseekV4 struct {
	Vocab, Hidden, Layers, Heads, HeadDim, QLora int
	OGroups, OLora, Window                       int
	RateCSA, RateHCA                             int
	IndexHeads, IndexDim, IndexTopK              int
	HCMult, HCIters                              int
	Experts, TopK, MoEFFN                        int
	RopeDim                                      int // rotary dims per head
	// HashLayers is the number of leading hash-routed MoE layers (0: 3;
	// negative: none).
	HashLayers int
	// LayerTypes is the attention kind of each layer (nil: transformers'
	// default, HCA for layers 0 and 1, then HCA and CSA alternating).
	LayerTypes []string
	Seed       uint64
	// MTP adds DeepSeek's multi-token-prediction block, mtp.0.* (the
	// released layout otherwise holds a stand-in the engine skips).
	MTP bool
	// Released writes the checkpoint in one of the formats DeepSeek-V4 ships
	// in (V4FP8MXFP4, V4FP8NVFP4, V4FP8Base: deepseekv4_released.go), with
	// DeepSeek's names and config; "" is the NVFP4 layout above.
	Released string
}

// withDefaults returns d with every zero field set to its default.
func (d DeepseekV4) withDefaults() DeepseekV4 {
	for _, f := range []struct {
		p *int
		v int
	}{
		{&d.Vocab, 129280}, {&d.Hidden, 4096}, {&d.Layers, 43}, {&d.Heads, 64}, {&d.HeadDim, 512},
		{&d.QLora, 1024}, {&d.OGroups, 8}, {&d.OLora, 1024}, {&d.Window, 128}, {&d.RateCSA, 4},
		{&d.RateHCA, 128}, {&d.IndexHeads, 64}, {&d.IndexDim, 128}, {&d.IndexTopK, 512}, {&d.HCMult, 4},
		{&d.HCIters, 20}, {&d.Experts, 256}, {&d.TopK, 6}, {&d.MoEFFN, 2048}, {&d.RopeDim, 64}, {&d.HashLayers, 3},
	} {
		if *f.p == 0 {
			*f.p = f.v
		}
	}
	if d.HashLayers < 0 {
		d.HashLayers = 0
	}
	if d.LayerTypes == nil {
		for i := 0; i < d.Layers; i++ {
			if i >= 2 && (i-2)%2 == 1 {
				d.LayerTypes = append(d.LayerTypes, V4CSA)
			} else {
				d.LayerTypes = append(d.LayerTypes, V4HCA)
			}
		}
	}
	return d
}

func (d DeepseekV4) check() error {
	if len(d.LayerTypes) != d.Layers {
		return fmt.Errorf("testmodel: %d layer types for %d layers", len(d.LayerTypes), d.Layers)
	}
	for _, k := range []struct {
		name string
		v    int
	}{
		{"hidden", d.Hidden}, {"q_lora", d.QLora}, {"heads*head_dim/o_groups", d.Heads * d.HeadDim / d.OGroups},
		{"o_groups*o_lora", d.OGroups * d.OLora}, {"moe_intermediate_size", d.MoEFFN},
	} {
		if k.v%quant.NVFP4BlockSize != 0 {
			return fmt.Errorf("testmodel: %s = %d is not a multiple of the NVFP4 block of %d", k.name, k.v, quant.NVFP4BlockSize)
		}
	}
	if d.Heads*d.HeadDim%d.OGroups != 0 {
		return fmt.Errorf("testmodel: o_groups %d does not divide heads*head_dim %d", d.OGroups, d.Heads*d.HeadDim)
	}
	if d.TopK > d.Experts {
		return fmt.Errorf("testmodel: top-k %d exceeds %d experts", d.TopK, d.Experts)
	}
	switch d.Released {
	case "", V4FP8NVFP4, V4FP8Base:
	case V4FP8MXFP4:
		if d.Hidden%quant.MXFP4BlockSize != 0 || d.MoEFFN%quant.MXFP4BlockSize != 0 {
			return fmt.Errorf("testmodel: hidden %d and moe_intermediate_size %d must be multiples of the MXFP4 block of %d", d.Hidden, d.MoEFFN, quant.MXFP4BlockSize)
		}
	default:
		return fmt.Errorf("testmodel: unknown released format %q (%s, %s, %s)", d.Released, V4FP8MXFP4, V4FP8NVFP4, V4FP8Base)
	}
	return nil
}

// Config is the config.json Write writes.
func (d DeepseekV4) Config() ([]byte, error) {
	d = d.withDefaults()
	if err := d.check(); err != nil {
		return nil, err
	}
	var mlp []string
	for i := 0; i < d.Layers; i++ {
		if i < d.HashLayers {
			mlp = append(mlp, V4HashMoE)
		} else {
			mlp = append(mlp, V4MoE)
		}
	}
	partial := float64(d.RopeDim) / float64(d.HeadDim)
	cfg := map[string]any{
		"architectures": []string{"DeepseekV4ForCausalLM"}, "model_type": "deepseek_v4",
		"vocab_size": d.Vocab, "hidden_size": d.Hidden, "num_hidden_layers": d.Layers,
		"num_attention_heads": d.Heads, "num_key_value_heads": 1, "head_dim": d.HeadDim, "q_lora_rank": d.QLora,
		"partial_rotary_factor": partial, "o_groups": d.OGroups, "o_lora_rank": d.OLora, "sliding_window": d.Window,
		"compress_rates": map[string]int{V4CSA: d.RateCSA, V4HCA: d.RateHCA},
		"index_n_heads":  d.IndexHeads, "index_head_dim": d.IndexDim, "index_topk": d.IndexTopK,
		"hc_mult": d.HCMult, "hc_sinkhorn_iters": d.HCIters, "hc_eps": 1e-6,
		"n_routed_experts": d.Experts, "n_shared_experts": 1, "num_experts_per_tok": d.TopK,
		"moe_intermediate_size": d.MoEFFN, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
		"scoring_func": "sqrtsoftplus", "layer_types": d.LayerTypes, "mlp_layer_types": mlp,
		"rms_norm_eps": 1e-6, "max_position_embeddings": 65536, "tie_word_embeddings": false,
		"rope_theta": 10000.0, "compress_rope_theta": 160000.0, "hidden_act": "silu",
		"rope_parameters": map[string]any{
			"main":     map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial},
			"compress": map[string]any{"rope_type": "default", "rope_theta": 160000.0, "partial_rotary_factor": partial},
		},
		"dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
	}
	if d.Released != "" {
		d.releasedConfig(cfg, mlp)
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// v4Tensor is one tensor of the checkpoint: its name, dtype, shape, how
// WeightBytes counts it, and how to generate its bytes.
type v4Tensor struct {
	name  string
	dtype weights.DType
	shape []int
	count v4Count
	make  func() []byte
}

type v4Count int

const (
	countAlways v4Count = iota // read by every decode step
	countExpert                // a routed expert's: read when selected
	countNever                 // the embedding table (one row read) and host-side routing tables
)

func (t v4Tensor) bytes() int64 {
	n := int64(t.dtype.Size())
	for _, s := range t.shape {
		n *= int64(s)
	}
	return n
}

// tensors lists the checkpoint's tensors in the order Write adds them.
func (d DeepseekV4) tensors() []v4Tensor {
	var out []v4Tensor
	g := v4Gen{seed: d.Seed}
	dense := func(name string, dtype weights.DType, mean, std float64, count v4Count, shape ...int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		out = append(out, v4Tensor{name: name, dtype: dtype, shape: shape, count: count,
			make: func() []byte { return g.normal(name, dtype, n, mean, std) }})
	}
	var lin linFunc
	nvfp4 := func(module string, count v4Count, rows, cols int) {
		name := module + ".weight"
		out = append(out,
			v4Tensor{name: name, dtype: weights.U8, shape: []int{rows, cols / 2}, count: count,
				make: func() []byte { return g.bytes(name, rows*cols/2) }},
			v4Tensor{name: name + "_scale", dtype: weights.F8E4M3, shape: []int{rows, cols / 16}, count: count,
				make: func() []byte { return g.scales(name+"_scale", rows*cols/16) }},
			v4Tensor{name: name + "_scale_2", dtype: weights.F32, shape: []int{}, count: count,
				make: func() []byte { // codes up to 6, block scales near 1: rows of norm about 1
					return binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(1/(6*math.Sqrt(float64(cols))))))
				}})
	}
	lin = nvfp4
	if d.Released != "" {
		lin = d.releasedLinear(g, &out, nvfp4, dense)
	}
	D, n, V := d.Hidden, d.HCMult, d.Vocab
	mix := (2 + n) * n
	hcStd := 1 / math.Sqrt(float64(n*D)) // mHC logits of unit scale
	dense("model.embed_tokens.weight", weights.BF16, 0, 1, countNever, V, D)
	dense("head.weight", weights.BF16, 0, 1/math.Sqrt(float64(D)), countAlways, V, D)
	dense("model.norm.weight", weights.BF16, 1, 0.05, countAlways, D)
	dense("model.hc_head.hc_fn", weights.F32, 0, hcStd, countAlways, n, n*D)
	dense("model.hc_head.hc_base", weights.F32, 0, 0.3, countAlways, n)
	dense("model.hc_head.hc_scale", weights.F32, 1, 0.1, countAlways, 1)
	hq := d.Heads * d.HeadDim
	layer := func(p, kind string, hash bool) {
		dense(p+"attn_norm.weight", weights.BF16, 1, 0.05, countAlways, D)
		dense(p+"ffn_norm.weight", weights.BF16, 1, 0.05, countAlways, D)
		for _, site := range []string{"hc_attn_", "hc_ffn_"} {
			dense(p+site+"fn", weights.F32, 0, hcStd, countAlways, mix, n*D)
			dense(p+site+"base", weights.F32, 0, 0.3, countAlways, mix)
			dense(p+site+"scale", weights.F32, 1, 0.2, countAlways, 3)
		}
		lin(p+"attn.wq_a", countAlways, d.QLora, D)
		dense(p+"attn.q_norm.weight", weights.BF16, 1, 0.05, countAlways, d.QLora)
		lin(p+"attn.wq_b", countAlways, hq, d.QLora)
		lin(p+"attn.wkv", countAlways, d.HeadDim, D)
		dense(p+"attn.norm.weight", weights.BF16, 1, 0.05, countAlways, d.HeadDim)
		lin(p+"attn.wo_a", countAlways, d.OGroups*d.OLora, hq/d.OGroups)
		lin(p+"attn.wo_b", countAlways, D, d.OGroups*d.OLora)
		dense(p+"attn.attn_sink", weights.F32, 0, 1, countAlways, d.Heads)
		comp := func(prefix string, width, rate int, csa bool) {
			row := width
			if csa {
				row = 2 * width
			}
			lin(prefix+"wkv", countAlways, row, D)
			lin(prefix+"wgate", countAlways, row, D)
			dense(prefix+"ape", weights.F32, 0, 0.5, countAlways, rate, row)
			dense(prefix+"norm.weight", weights.BF16, 1, 0.05, countAlways, width)
		}
		switch kind {
		case V4HCA:
			comp(p+"attn.compressor.", d.HeadDim, d.RateHCA, false)
		case V4CSA:
			comp(p+"attn.compressor.", d.HeadDim, d.RateCSA, true)
			comp(p+"attn.indexer.compressor.", d.IndexDim, d.RateCSA, true)
			lin(p+"attn.indexer.wq_b", countAlways, d.IndexHeads*d.IndexDim, d.QLora)
			lin(p+"attn.indexer.weights_proj", countAlways, d.IndexHeads, D)
		}
		dense(p+"ffn.gate.weight", weights.BF16, 0, 1/math.Sqrt(float64(D)), countAlways, d.Experts, D)
		if hash {
			name := p + "ffn.gate.tid2eid"
			out = append(out, v4Tensor{name: name, dtype: weights.I64, shape: []int{V, d.TopK}, count: countNever,
				make: func() []byte { return g.hash(name, V, d.Experts, d.TopK) }})
		} else {
			dense(p+"ffn.gate.bias", weights.F32, 0, 0.1, countNever, d.Experts)
		}
		for e := 0; e < d.Experts; e++ {
			ep := fmt.Sprintf("%sffn.experts.%d.", p, e)
			lin(ep+"w1", countExpert, d.MoEFFN, D)
			lin(ep+"w3", countExpert, d.MoEFFN, D)
			lin(ep+"w2", countExpert, D, d.MoEFFN)
		}
		lin(p+"ffn.shared_experts.w1", countAlways, d.MoEFFN, D)
		lin(p+"ffn.shared_experts.w3", countAlways, d.MoEFFN, D)
		lin(p+"ffn.shared_experts.w2", countAlways, D, d.MoEFFN)
	}
	for l := 0; l < d.Layers; l++ {
		layer(fmt.Sprintf("model.layers.%d.", l), d.LayerTypes[l], l < d.HashLayers)
	}
	if d.MTP {
		// DeepSeek's MTP block (mtp.0.*, model/mtp.go): one sliding-window
		// layer with a routed MoE, its input projections and norms, its own
		// hc_head; it shares the embedding and the head. Not read by a
		// plain decode step (countNever).
		first := len(out)
		layer("mtp.0.", V4Sliding, false)
		lin("mtp.0.e_proj", countAlways, D, D)
		lin("mtp.0.h_proj", countAlways, D, D)
		for _, nm := range []string{"enorm", "hnorm", "norm"} {
			dense("mtp.0."+nm+".weight", weights.BF16, 1, 0.05, countAlways, D)
		}
		dense("mtp.0.hc_head_fn", weights.F32, 0, hcStd, countAlways, n, n*D)
		dense("mtp.0.hc_head_base", weights.F32, 0, 0.3, countAlways, n)
		dense("mtp.0.hc_head_scale", weights.F32, 1, 0.1, countAlways, 1)
		for i := first; i < len(out); i++ {
			out[i].count = countNever
			if d.Released != "" && out[i].name == "mtp.0.attn.norm.weight" {
				out[i].name = "mtp.0.attn.kv_norm.weight"
			}
		}
	}
	if d.Released != "" {
		if !d.MTP {
			d.mtpTensors(lin, dense)
		}
		for i := range out {
			out[i].name = nvfp4ckpt.V4ReleasedName(out[i].name)
		}
	}
	return out
}

// v4ShardBytes bounds a shard, so that writing needs at most this much disk
// beyond the checkpoint (a shard's data goes through a temporary file).
const v4ShardBytes = 4 << 30

// Write creates dir/config.json, dir/hf_quant_config.json and the weights
// (dir/model.safetensors, or shards of at most 4 GiB and their index).
// Tensors are generated on every core, each from its own seed (the same
// bytes whatever the core count), while the previous ones are written.
// config.json is written last, so a folder holding it holds a whole checkpoint.
func (d DeepseekV4) Write(dir string) error { return d.WriteProgress(dir, nil) }

// WriteProgress is Write, calling progress (when not nil) after each tensor
// with the tensor bytes added so far and CheckpointBytes. The last call
// (done == total) comes before the last shard is finished. An error from
// progress stops the write and is returned; config.json is then not written.
func (d DeepseekV4) WriteProgress(dir string, progress func(done, total int64) error) error {
	cfg, err := d.Config()
	if err != nil {
		return err
	}
	d = d.withDefaults()
	// A config.json left from an earlier checkpoint would make this folder
	// look whole while it is being rewritten.
	if err := os.Remove(filepath.Join(dir, "config.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	q := `{"producer": {"name": "manifold-testmodel"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, ` +
		`"exclude_modules": ["head", "model.embed_tokens", "model.layers.*.ffn.gate"]}}`
	switch d.Released {
	case "":
	case V4FP8NVFP4: // ModelOpt's mixed recipe: NVFP4 routed experts, the rest as released
		q = `{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION", "moe_quant_algo": "NVFP4", ` +
			`"quant_method": "fp8", "weight_block_size": [128, 128], "group_size": 16, "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]}}`
	default:
		q = "" // quantization_config in config.json only
	}
	if q != "" {
		if err := os.WriteFile(filepath.Join(dir, "hf_quant_config.json"), []byte(q), 0o644); err != nil {
			return err
		}
	}
	type made struct {
		t    v4Tensor
		data []byte
	}
	ch := make(chan made, 4)
	stop := make(chan struct{})
	go func() {
		defer close(ch)
		for _, t := range d.tensors() {
			select {
			case ch <- made{t, t.make()}:
			case <-stop:
				return
			}
		}
	}()
	w := weights.NewShardedWriter(dir, v4ShardBytes, map[string]string{"format": "pt"})
	var done, total int64
	if progress != nil {
		total = d.CheckpointBytes()
	}
	for m := range ch {
		if err = w.Add(m.t.name, m.t.dtype, m.t.shape, m.data); err != nil {
			break
		}
		if progress != nil {
			done += int64(len(m.data))
			if err = progress(done, total); err != nil {
				break
			}
		}
	}
	if err != nil {
		close(stop)
		for range ch { // let the generator finish its current tensor
		}
		return errors.Join(err, w.Close())
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
}

// WeightBytes is the bytes of weights one decode step reads: every tensor
// on the device except the embedding table (of which one row is read) and
// the routed experts, plus top-k routed experts per layer. Counted in full:
// the NVFP4 linears (packed codes, block scales and the 4-byte global scale)
// of attention, the compressors, the indexer and the shared expert; the
// routed experts' linears, TopK of them per layer; the bf16 LM head, norms
// and router weight; the f32 mHC parameters (hc_*_fn, base, scale and
// hc_head), attention sinks and compressor ape (read only when a window
// closes, counted anyway: under 0.1%). Not counted: the embedding table, the
// unselected experts, and the tables routing reads on the host (the hash
// layers' tid2eid and the router bias). The KV caches are not weights and are
// not counted either.
func (d DeepseekV4) WeightBytes() int64 {
	d = d.withDefaults()
	var total, expert int64
	for _, t := range d.tensors() {
		switch t.count {
		case countAlways:
			total += t.bytes()
		case countExpert:
			expert += t.bytes()
		}
	}
	return total + expert/int64(d.Experts)*int64(d.TopK)
}

// CheckpointBytes is the size of the tensor data Write writes.
func (d DeepseekV4) CheckpointBytes() int64 {
	d = d.withDefaults()
	var n int64
	for _, t := range d.tensors() {
		n += t.bytes()
	}
	return n
}

// v4Gen generates tensor bytes in chunks of fixed size, each chunk from a
// generator seeded by the model seed, the tensor name and the chunk index,
// spread over the cores.
type v4Gen struct{ seed uint64 }

const v4Chunk = 1 << 16 // elements of a chunk

func (g v4Gen) rng(name string, chunk int) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(g.seed^h.Sum64(), uint64(chunk)))
}

// chunks runs f over [0, n) in chunks of v4Chunk elements on every core.
func (g v4Gen) chunks(name string, n int, f func(r *rand.Rand, lo, hi int)) {
	count := (n + v4Chunk - 1) / v4Chunk
	if count <= 1 {
		f(g.rng(name, 0), 0, n)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(count, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := int(next.Add(1) - 1); c < count; c = int(next.Add(1) - 1) {
				f(g.rng(name, c), c*v4Chunk, min((c+1)*v4Chunk, n))
			}
		}()
	}
	wg.Wait()
}

// normal is n values of mean + std·N(0, 1) in dtype (F32 or BF16).
func (g v4Gen) normal(name string, dtype weights.DType, n int, mean, std float64) []byte {
	size := dtype.Size()
	buf := make([]byte, n*size)
	g.chunks(name, n, func(r *rand.Rand, lo, hi int) {
		for i := lo; i < hi; i++ {
			v := float32(mean + std*r.NormFloat64())
			if size == 4 {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
			} else {
				binary.LittleEndian.PutUint16(buf[2*i:], quant.Float32ToBF16(v))
			}
		}
	})
	return buf
}

// bytes is n uniformly random bytes (two random E2M1 codes each).
func (g v4Gen) bytes(name string, n int) []byte {
	buf := make([]byte, n)
	g.chunks(name, (n+7)/8, func(r *rand.Rand, lo, hi int) {
		for i := lo; i < hi; i++ {
			if 8*i+8 <= n {
				binary.LittleEndian.PutUint64(buf[8*i:], r.Uint64())
			} else {
				var tmp [8]byte
				binary.LittleEndian.PutUint64(tmp[:], r.Uint64())
				copy(buf[8*i:], tmp[:])
			}
		}
	})
	return buf
}

// scales is n E4M3 block scales uniform in [0.5, 1.5).
func (g v4Gen) scales(name string, n int) []byte {
	var table [256]byte
	for i := range table {
		table[i] = quant.Float32ToE4M3(float32(0.5 + float64(i)/256))
	}
	buf := g.bytes(name, n)
	for i, b := range buf {
		buf[i] = table[b]
	}
	return buf
}

// hash is a tid2eid table: for each of vocab tokens, k distinct experts of
// experts, as int64.
func (g v4Gen) hash(name string, vocab, experts, k int) []byte {
	buf := make([]byte, 8*vocab*k)
	g.chunks(name, vocab, func(r *rand.Rand, lo, hi int) {
		perm := make([]int, experts)
		for t := lo; t < hi; t++ {
			for i := range perm {
				perm[i] = i
			}
			for j := 0; j < k; j++ {
				s := j + r.IntN(experts-j)
				perm[j], perm[s] = perm[s], perm[j]
				binary.LittleEndian.PutUint64(buf[8*(t*k+j):], uint64(perm[j]))
			}
		}
	})
	return buf
}
