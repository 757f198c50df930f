package model

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// DeepseekV4 is DeepSeek-V4 as transformers 5.17 defines it (model_type
// deepseek_v4; docs/deepseek_v4.md states the forward pass): an mHC residual
// of hc_mult streams around every attention and MoE block; shared-KV
// multi-query attention with per-head sinks over a sliding window, plus
// compressed entries on CSA layers (overlapping windows, lightning-indexer
// top-k) and HCA layers (non-overlapping windows, all entries); partial
// interleaved RoPE with the inverse rotation on the output; a grouped
// low-rank output projection; MoE with sqrtsoftplus or hash routing, a shared
// expert and clamped SwiGLU.
//
// Besides backend.Backend it needs the backend to implement backend.HyperConnectionOps and
// backend.CompressedAttentionOps. Tensor names are the checkpoint's (DeepSeek's original names).
type DeepseekV4 struct {
	b      backend.Backend
	hc     backend.HyperConnectionOps
	ops    backend.CompressedAttentionOps
	moeOps backend.RoutedMoEOps            // optional: routing and routed experts on the device
	fused  backend.FusedHyperConnectionOps // optional: a site's coefficients and Pre in one call
	// Optional, for running a token held on the device (ForwardSampled):
	// its embedding, and the hash-routed layers' expert ids gathered by it.
	pipe    backend.TokenPipeliner
	hashOps backend.DeviceHashMoEOps
	cfg     *Config
	v       *v4Config
	mixer   *mhc.Mixer

	mainRoPE, compRoPE *layers.RoPE
	ones               backend.Buffer // [head_dim] weights of the unweighted per-head q norm

	embed, lmHead backend.Weight
	norm          backend.Buffer
	hcHeadFn      backend.Weight
	hcHeadBase    backend.Buffer
	hcHeadScale   float32

	blocks []v4Block
	mtp    *v4MTP // the MTP block (mtp.go), nil unless loaded

	// The placement of the routed experts (offload.go), the backend holding
	// those on the host and its loader (nil when every expert is on the
	// device).
	plan       *ExpertPlan
	host       backend.Backend
	hostLoader *Loader

	// Tests set these: the rows a forward pass runs (0: chunkRows's bound),
	// the indexer scores one pass may hold (0: chunkScoreBudget).
	maxChunk, scoreBudget int
}

// v4Block is one decoder layer's weights.
type v4Block struct {
	kind    string // layer_types entry
	rate    int    // compression rate (0: sliding)
	hash    []int32
	hashTab backend.Weight // hash as a [vocab, K] table of ids in float32 bits on the device (ForwardSampled), or nil
	AttnHC  v4HC
	FFNHC   v4HC
	Attn    v4Attn
	WOA     []backend.Weight // o_groups weights [o_lora_rank, heads*head_dim/o_groups]
	Comp    *v4Compressor
	Indexer *v4Indexer
	FFN     v4FFN
	Experts []v4Expert      // [0, E-host) on the device backend, the rest on the host backend
	host    int             // routed experts in host memory: the last host of them
	dev     backend.Experts // the routed experts bound for the device MoE, or nil
}

type v4HC struct {
	Fn          backend.Weight
	Base, Scale backend.Buffer
}

type v4Attn struct {
	AttnNorm backend.Buffer `w:"attn_norm.weight" shape:"hidden"`
	FFNNorm  backend.Buffer `w:"ffn_norm.weight" shape:"hidden"`
	WQA      backend.Weight `w:"attn.wq_a" shape:"q_lora,hidden"`
	QNorm    backend.Buffer `w:"attn.q_norm.weight" shape:"q_lora"`
	WQB      backend.Weight `w:"attn.wq_b" shape:"q,q_lora"`
	WKV      backend.Weight `w:"attn.wkv" shape:"head_dim,hidden"`
	KVNorm   backend.Buffer `w:"attn.norm.weight" shape:"head_dim"`
	WOB      backend.Weight `w:"attn.wo_b" shape:"hidden,o"`
	Sinks    backend.Buffer `w:"attn.attn_sink" shape:"heads"`
}

// v4Compressor is a CSA or HCA compressor (or the indexer's).
type v4Compressor struct {
	WKV   backend.Weight `w:"wkv" shape:"row,hidden"`
	WGate backend.Weight `w:"wgate" shape:"row,hidden"`
	APE   backend.Buffer `w:"ape" shape:"rate,row"`
	Norm  backend.Buffer `w:"norm.weight" shape:"width"`
	width int
	rate  int
	csa   bool
}

func (c *v4Compressor) rowWidth() int {
	if c.csa {
		return 2 * c.width
	}
	return c.width
}

type v4Indexer struct {
	Comp        *v4Compressor
	WQB         backend.Weight `w:"attn.indexer.wq_b" shape:"iq,q_lora"`
	WeightsProj backend.Weight `w:"attn.indexer.weights_proj" shape:"iheads,hidden"`
}

type v4FFN struct {
	Gate   backend.Weight // ffn.gate.weight [experts, hidden], no bias: ffn.gate.bias only selects
	Bias   []float32      // ffn.gate.bias (moe layers): the host route reads it, BindExperts uploads it
	Shared v4Expert       // ffn.shared_experts.
}

// v4Expert is one SwiGLU expert, routed or shared.
type v4Expert struct {
	W1 backend.Weight `w:"w1" shape:"ffn,hidden"`
	W3 backend.Weight `w:"w3" shape:"ffn,hidden"`
	W2 backend.Weight `w:"w2" shape:"hidden,ffn"`
}

// forward writes W2 · SwiGLU(W1·x, W3·x) (clamped at limit) of n rows of x
// into out, through g and u ([n, ffn] scratch, g left holding the SwiGLU).
func (ex *v4Expert) forward(b backend.Backend, out, g, u, x backend.Buffer, n int, limit float32) {
	b.MatMul(g, x, ex.W1, n)
	b.MatMul(u, x, ex.W3, n)
	b.SwiGLU(g, g, u, limit)
	b.MatMul(out, g, ex.W2, n)
}

func newDeepseekV4(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	if o.Attention.Kind == "htree" {
		return nil, fmt.Errorf("model: %s does not support htree attention (llama and qwen3 do)", cfg.ModelType)
	}
	return loadDeepseekV4Placed(b, cfg, l, o.MTP, o.Experts)
}

func loadDeepseekV4(b backend.Backend, cfg *Config, l *Loader) (*DeepseekV4, error) {
	return loadDeepseekV4With(b, cfg, l, false)
}

// loadDeepseekV4With loads the model, and its MTP block (mtp.0.*) when mtp
// is set and the checkpoint carries it (model/mtp.go).
func loadDeepseekV4With(b backend.Backend, cfg *Config, l *Loader, mtp bool) (*DeepseekV4, error) {
	return loadDeepseekV4Placed(b, cfg, l, mtp, ExpertPlacement{})
}

// loadDeepseekV4Placed loads the model: its weights but the routed experts,
// then the routed experts where the placement plan puts them (offload.go).
func loadDeepseekV4Placed(b backend.Backend, cfg *Config, l *Loader, mtp bool, place ExpertPlacement) (*DeepseekV4, error) {
	hc := l.caps.HyperConnection
	if hc == nil {
		return nil, fmt.Errorf("model: deepseek_v4 needs hyper-connection ops (backend.HyperConnectionOps); backend %s lacks them", b.Name())
	}
	ops := l.caps.Compressed
	if ops == nil {
		return nil, fmt.Errorf("model: deepseek_v4 needs compressed-attention ops (backend.CompressedAttentionOps); backend %s lacks them", b.Name())
	}
	v, err := parseV4Config(cfg)
	if err != nil {
		return nil, err
	}
	mixer, err := mhc.New(mhc.Config{
		Streams: v.HCMult, Hidden: cfg.HiddenSize, SinkhornIters: v.HCSinkhornIters,
		Eps: float32(v.HCEps), NormEps: cfg.RMSNormEps, Residual: v.residual,
	})
	if err != nil {
		return nil, configErr(cfg.Path, "hc_mult", "%v", err)
	}
	l.rename = v4ReleasedNames(l.ck) // DeepSeek's layout as released (deepseek_v4_released.go)
	m := &DeepseekV4{b: b, hc: hc, ops: ops, cfg: cfg, v: v, mixer: mixer}
	m.moeOps, m.fused = l.caps.RoutedMoE, l.caps.FusedHyper
	m.pipe, m.hashOps = l.caps.Pipeliner, l.caps.DeviceHashMoE
	if m.mainRoPE, err = cfg.NewRoPE(v.mainRoPE, v.HeadDim); err != nil {
		return nil, err
	}
	if m.compRoPE, err = cfg.NewRoPE(v.compressRoPE, v.HeadDim); err != nil {
		return nil, err
	}
	m.mainRoPE.Interleaved, m.compRoPE.Interleaved = true, true
	if r := max(m.mainRoPE.Dim(), m.compRoPE.Dim()); r > v.HeadDim {
		return nil, configErr(cfg.Path, "partial_rotary_factor", "rotary dim %d exceeds head_dim %d", r, v.HeadDim)
	}
	if slices.Contains(v.LayerTypes, v4CSA) && m.compRoPE.Dim() > v.IndexHeadDim {
		return nil, configErr(cfg.Path, "index_head_dim", "%d is smaller than the rotary dim %d", v.IndexHeadDim, m.compRoPE.Dim())
	}
	ones := make([]float32, v.HeadDim)
	for i := range ones {
		ones[i] = 1
	}
	m.ones = b.NewBuffer(v.HeadDim)
	b.Write(m.ones, 0, ones)

	D, V, n := cfg.HiddenSize, cfg.VocabSize, v.HCMult
	if m.embed, err = l.Matrix("model.embed_tokens.weight", V, D); err != nil {
		return nil, err
	}
	m.lmHead = m.embed // tie_word_embeddings: lm_head is the embedding
	if !cfg.TieWordEmbeddings || l.Has("head.weight") {
		if m.lmHead, err = l.Matrix("head.weight", V, D); err != nil {
			return nil, err
		}
	}
	if m.norm, err = l.Vector("model.norm.weight", D); err != nil {
		return nil, err
	}
	if m.hcHeadFn, err = l.Matrix("model.hc_head.hc_fn", n, n*D); err != nil {
		return nil, err
	}
	if m.hcHeadBase, err = l.Vector("model.hc_head.hc_base", n); err != nil {
		return nil, err
	}
	sc, err := l.Float32("model.hc_head.hc_scale", 1)
	if err != nil {
		return nil, err
	}
	m.hcHeadScale = sc[0]

	H, hd := cfg.NumHeads, v.HeadDim
	dims := map[string]int{
		"hidden": D, "q_lora": v.QLoraRank, "q": H * hd, "head_dim": hd, "o": v.OGroups * v.OLoraRank,
		"heads": H, "ffn": v.MoEIntermediateSize, "iq": v.IndexNHeads * v.IndexHeadDim, "iheads": v.IndexNHeads,
	}
	m.blocks = make([]v4Block, cfg.NumLayers)
	for i := range m.blocks {
		if err := m.loadBlock(l, fmt.Sprintf("model.layers.%d.", i), &m.blocks[i], v.LayerTypes[i], v.MLPLayerTypes[i], dims); err != nil {
			return nil, err
		}
	}
	if mtp {
		if m.mtp, err = m.loadMTP(l, dims); err != nil {
			return nil, err
		}
	}
	if err := m.planV4(l, place, mtp); err != nil {
		return nil, err
	}
	for i := range m.blocks {
		blk := &m.blocks[i]
		blk.host = m.v.NRoutedExperts - m.plan.Device[i]
		if err := m.loadRoutedExperts(l, fmt.Sprintf("model.layers.%d.", i), blk, dims); err != nil {
			return nil, err
		}
		if err := m.uploadHash(fmt.Sprintf("model.layers.%d.", i), blk); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// uploadHash puts a hash-routed layer's table on the device as a [vocab,
// K] matrix of ids, each an int32 in a float32's bits, where the backend
// can run a held token's step (TokenPipeliner) with device-side hashing
// (DeviceHashMoEOps) and the layer's experts run there: a held token's
// picks are then the table's row, gathered by the held id as an embedding
// row is (a bitwise copy), with no id on the host.
func (m *DeepseekV4) uploadHash(prefix string, blk *v4Block) error {
	if blk.hash == nil || m.pipe == nil || m.hashOps == nil || blk.dev == nil {
		return nil
	}
	K := m.v.NumExpertsPerTok
	data := make([]byte, 4*len(blk.hash))
	for i, e := range blk.hash {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(e))
	}
	w, err := m.b.Upload(&backend.HostWeight{Name: prefix + "ffn.gate.tid2eid", Rows: len(blk.hash) / K, Cols: K, Format: backend.F32, Data: data})
	if err != nil {
		return fmt.Errorf("model: %sffn.gate.tid2eid on the device: %w", prefix, err)
	}
	blk.hashTab = w
	return nil
}

// loadBlock binds the decoder layer under prefix (attention of kind, MoE of
// mlpKind) into blk.
func (m *DeepseekV4) loadBlock(l *Loader, prefix string, blk *v4Block, kind, mlpKind string, dims map[string]int) error {
	cfg, v := m.cfg, m.v
	blk.kind = kind
	blk.rate = v.rate(blk.kind)
	D, n := cfg.HiddenSize, v.HCMult
	for _, s := range []struct {
		hc   *v4HC
		name string
	}{{&blk.AttnHC, "hc_attn_"}, {&blk.FFNHC, "hc_ffn_"}} {
		var err error
		if s.hc.Fn, err = l.Matrix(prefix+s.name+"fn", m.mixer.Config().MixDim(), n*D); err != nil {
			return err
		}
		if s.hc.Base, err = l.Vector(prefix+s.name+"base", m.mixer.Config().MixDim()); err != nil {
			return err
		}
		if s.hc.Scale, err = l.Vector(prefix+s.name+"scale", 3); err != nil {
			return err
		}
	}
	if err := l.Bind(prefix, &blk.Attn, dims); err != nil {
		return err
	}
	var err error
	if blk.WOA, err = m.loadGrouped(l, prefix+"attn.wo_a"); err != nil {
		return err
	}
	bindComp := func(p string, width int, csa bool) (*v4Compressor, error) {
		c := &v4Compressor{width: width, rate: blk.rate, csa: csa}
		d := map[string]int{"hidden": D, "row": c.rowWidth(), "rate": blk.rate, "width": width}
		if err := l.Bind(p, c, d); err != nil {
			return nil, err
		}
		return c, nil
	}
	switch blk.kind {
	case v4HCA:
		if blk.Comp, err = bindComp(prefix+"attn.compressor.", v.HeadDim, false); err != nil {
			return err
		}
	case v4CSA:
		if blk.Comp, err = bindComp(prefix+"attn.compressor.", v.HeadDim, true); err != nil {
			return err
		}
		blk.Indexer = &v4Indexer{}
		if err := l.Bind(prefix, blk.Indexer, dims); err != nil {
			return err
		}
		if blk.Indexer.Comp, err = bindComp(prefix+"attn.indexer.compressor.", v.IndexHeadDim, true); err != nil {
			return err
		}
	}

	// MoE.
	E, K := v.NRoutedExperts, v.NumExpertsPerTok
	if blk.FFN.Gate, err = l.Matrix(prefix+"ffn.gate.weight", E, D); err != nil {
		return err
	}
	if err := l.Bind(prefix+"ffn.shared_experts.", &blk.FFN.Shared, dims); err != nil {
		return err
	}
	if mlpKind == v4HashMoE {
		name := prefix + "ffn.gate.tid2eid"
		t, err := l.Tensor(name)
		if err != nil {
			return err
		}
		if len(t.Shape) != 2 || t.Shape[0] != cfg.VocabSize || t.Shape[1] != K {
			return shapeErr(t, []int{cfg.VocabSize, K})
		}
		ids, err := t.Int64s()
		if err != nil {
			return err
		}
		blk.hash = make([]int32, len(ids))
		for j, e := range ids {
			if e < 0 || e >= int64(E) {
				return fmt.Errorf("%w: %s: tensor %q: token %d maps to expert %d, outside the config's [0, %d)", ErrConfig, t.File, t.Name, j/K, e, E)
			}
			blk.hash[j] = int32(e)
		}
	} else if l.Has(prefix + "ffn.gate.bias") {
		if blk.FFN.Bias, err = l.Float32(prefix+"ffn.gate.bias", E); err != nil {
			return err
		}
	}
	return nil
}

// loadRoutedExperts binds the routed experts of the layer under prefix:
// the first E-blk.host on the device backend (bound for its MoE when it has
// one and every expert is there), the others on the host backend.
func (m *DeepseekV4) loadRoutedExperts(l *Loader, prefix string, blk *v4Block, dims map[string]int) error {
	v := m.v
	E := v.NRoutedExperts
	blk.Experts = make([]v4Expert, E)
	for e := range blk.Experts {
		el := l
		if e >= E-blk.host {
			el = m.hostLoader
		}
		if err := el.Bind(fmt.Sprintf("%sffn.experts.%d.", prefix, e), &blk.Experts[e], dims); err != nil {
			return err
		}
		if err := v.checkExpertFormat(l, fmt.Sprintf("%sffn.experts.%d.", prefix, e)); err != nil {
			return err
		}
	}
	if m.moeOps != nil && blk.host == 0 {
		var err error
		w1, w3, w2 := make([]backend.Weight, E), make([]backend.Weight, E), make([]backend.Weight, E)
		for e, ex := range blk.Experts {
			w1[e], w3[e], w2[e] = ex.W1, ex.W3, ex.W2
		}
		if blk.dev, err = m.moeOps.BindExperts(w1, w3, w2, blk.FFN.Bias); err != nil {
			return fmt.Errorf("model: %s routed experts: %w", prefix, err)
		}
	}
	return nil
}

// loadGrouped uploads the module wo_a ([o_groups*o_lora_rank,
// heads*head_dim/o_groups]) as one weight per group: group g is rows
// [g*o_lora_rank, (g+1)*o_lora_rank), in the stored format (NVFP4 or dense).
func (m *DeepseekV4) loadGrouped(l *Loader, module string) ([]backend.Weight, error) {
	v := m.v
	rows, cols := v.OLoraRank, m.cfg.NumHeads*v.HeadDim/v.OGroups
	parts := make([]int, v.OGroups)
	for g := range parts {
		parts[g] = rows
	}
	return l.LinearSplit(module, cols, parts...)
}

// Config is the model's config.
func (m *DeepseekV4) Config() *Config { return m.cfg }

// ---------------------------------------------------------------------------
// Forward pass.

// v4ReplayChunk bounds the tokens per forward pass when a rewound state
// replays its tokens.
const v4ReplayChunk = 512

// chunkRows is the most rows one forward pass runs from position pos0
// (indexedChunkRows over the densest indexed layer's entries).
func (m *DeepseekV4) chunkRows(pos0 int) int {
	if m.maxChunk > 0 {
		return m.maxChunk
	}
	rate := 0
	for _, blk := range m.blocks {
		if blk.Indexer != nil && (rate == 0 || blk.rate < rate) {
			rate = blk.rate
		}
	}
	budget := chunkScoreBudget
	if m.scoreBudget > 0 {
		budget = m.scoreBudget
	}
	return indexedChunkRows(pos0, rate, budget)
}

// Forward runs tokens at positions Len().. and appends them to the state. On
// error (cancellation included) the state is left as it was. A long run of
// tokens goes through the model in passes of chunkRows rows; with all, the
// logits of each pass are read back before the next one.
func (m *DeepseekV4) Forward(ctx context.Context, st State, tokens []int32, all bool) ([]float32, error) {
	if !all {
		logits, err := m.run(ctx, st, tokens, false, nil)
		return hostLogits(m.b, logits, err)
	}
	out := make([]float32, 0, len(tokens)*m.cfg.VocabSize)
	_, err := m.run(ctx, st, tokens, true, func(logits backend.Buffer) {
		out = out[:len(out)+logits.Len()]
		m.b.Read(out[len(out)-logits.Len():], logits, 0)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ForwardDevice runs the decoder over tokens and leaves the last token's
// logits on the backend (valid until the next call with st), so that a
// backend that samples picks the token there.
func (m *DeepseekV4) ForwardDevice(ctx context.Context, st State, tokens []int32) (backend.Buffer, error) {
	return m.run(ctx, st, tokens, false, nil)
}

// ForwardSampled runs the token whose id src holds on the backend (see
// SampledForwarder) and leaves its logits there. Where every layer's
// routed experts run on the device (and a hash-routed layer's table is
// there: uploadHash), the step is queued without the id: its embedding and
// the hashed picks are gathered by the held id, and the id is copied to
// the state's record of held tokens, from which a later replay of the
// state's tokens reads it. Otherwise the id is read back first (the host
// routes, or hashes) and the token runs as ForwardDevice runs it.
func (m *DeepseekV4) ForwardSampled(ctx context.Context, st State, src backend.Buffer) (backend.Buffer, error) {
	s, ok := st.(*v4State)
	if !ok || s.m != m {
		return nil, fmt.Errorf("model: state of type %T is not a state of this %s model", st, m.cfg.ModelType)
	}
	if src.Len() != 1 {
		return nil, fmt.Errorf("model: a held token is a buffer of 1 id, not %d", src.Len())
	}
	if !m.runsHeld() {
		var v [1]float32
		m.b.Read(v[:], src, 0)
		return m.ForwardDevice(ctx, st, []int32{max(int32(math.Float32bits(v[0])), 0)}) // a NaN pick (-1-id): its step is dropped
	}
	if err := checkForward(m.cfg, st, []int32{0}); err != nil {
		return nil, err
	}
	if s.done < len(s.hist) { // a rewind left tokens to replay: they run first, on their own
		if _, err := m.passes(ctx, s, nil, false, nil); err != nil {
			return nil, err
		}
	}
	return m.runHeld(ctx, s, src)
}

// runsHeld reports whether a held token's step can run without its id on
// the host: the backend embeds held tokens, and every layer routes and
// runs its experts on the device at one token, hashing there where it
// hashes.
func (m *DeepseekV4) runsHeld() bool {
	if m.pipe == nil || m.moeOps == nil || m.moeOps.MaxDeviceMoETokens() < 1 {
		return false
	}
	for i := range m.blocks {
		if blk := &m.blocks[i]; blk.dev == nil || blk.hash != nil && blk.hashTab == nil {
			return false
		}
	}
	return true
}

// runHeld is ForwardSampled's pass: position s.done, the token in src.
func (m *DeepseekV4) runHeld(ctx context.Context, s *v4State, src backend.Buffer) (backend.Buffer, error) {
	b := m.b
	pos := len(s.hist)
	if s.heldIDs == nil {
		s.heldIDs, s.heldHash = b.NewBuffer(v4HeldRing), b.NewBuffer(m.v.NumExpertsPerTok)
	}
	if len(s.heldAt) > 0 && pos-s.heldAt[0] >= v4HeldRing {
		s.resolveHeld() // the oldest record's slot comes round again
	}
	// The id goes to the record first: the pick queued after this step
	// writes src again.
	b.Copy(b.View(s.heldIDs, pos%v4HeldRing, 1), src)
	s.hist = append(s.hist, 0) // known once the record is read (resolveHeld)
	logits, err := m.forward(ctx, s, s.hist[pos:], 1, src)
	if err != nil {
		s.hist = s.hist[:pos]
		return nil, err
	}
	s.heldAt = append(s.heldAt, pos)
	return logits, nil
}

// run is Forward up to the logits, which stay on the backend: the last
// token's, or with all every token's, passed to emit pass by pass (the
// returned buffer is then the last pass's).
func (m *DeepseekV4) run(ctx context.Context, st State, tokens []int32, all bool, emit func(backend.Buffer)) (backend.Buffer, error) {
	s, ok := st.(*v4State)
	if !ok || s.m != m {
		return nil, fmt.Errorf("model: state of type %T is not a state of this %s model", st, m.cfg.ModelType)
	}
	if err := checkForward(m.cfg, st, tokens); err != nil {
		return nil, err
	}
	return m.passes(ctx, s, tokens, all, emit)
}

// passes is run after its checks: the tokens a rewind left to replay, then
// tokens (none: the replay alone, as ForwardSampled asks for it).
func (m *DeepseekV4) passes(ctx context.Context, s *v4State, tokens []int32, all bool, emit func(backend.Buffer)) (backend.Buffer, error) {
	if s.done < len(s.hist) {
		s.resolveHeld() // the replay reads the ids of tokens run while held
	}
	start := len(s.hist)
	s.hist = append(s.hist, tokens...)
	// pass runs hist[done:done+n], keeping the logits of its last want rows.
	pass := func(n, want int) (backend.Buffer, error) {
		logits, err := m.forward(ctx, s, s.hist[s.done:s.done+n], want, nil)
		if err != nil {
			// The failed pass has rewound itself; earlier passes of this
			// call are cut away (or replayed later) by Truncate.
			if s.done > start {
				s.Truncate(start)
			} else {
				s.hist = s.hist[:start]
			}
			return nil, err
		}
		return logits, nil
	}
	if s.done < start && start < len(s.hist) && len(s.hist)-s.done <= min(v4ReplayChunk, m.chunkRows(s.done)) {
		// A short replay (a rollback into the last call, as speculative
		// decoding's) runs in the same pass as the new tokens.
		want := 1
		if all {
			want = len(tokens)
		}
		logits, err := pass(len(s.hist)-s.done, want)
		if err == nil && emit != nil {
			emit(logits)
		}
		return logits, err
	}
	for s.done < start { // replay what a rewind left out
		if _, err := pass(min(v4ReplayChunk, m.chunkRows(s.done), start-s.done), 1); err != nil {
			return nil, err
		}
	}
	var logits backend.Buffer
	for s.done < len(s.hist) {
		n := min(m.chunkRows(s.done), len(s.hist)-s.done)
		want := 1
		if all {
			want = n
		}
		var err error
		if logits, err = pass(n, want); err != nil {
			return nil, err
		}
		if emit != nil {
			emit(logits)
		}
	}
	return logits, nil
}

// forward runs tokens at positions s.done.. through the caches and returns
// the logits of the last want rows. When ctx is canceled it restores the
// caches and returns the error. With an MTP block, the residual streams
// the block's next Draft reads are kept. held, when not nil, holds the one
// token's id on the device (ForwardSampled; tokens is then a stand-in).
func (m *DeepseekV4) forward(ctx context.Context, s *v4State, tokens []int32, want int, held backend.Buffer) (backend.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, cfg, v := m.b, m.cfg, m.v
	n, pos0 := len(tokens), s.done
	D, nh := cfg.HiddenSize, v.HCMult
	rows := min(max(want, 1), n) // the rows whose logits are returned
	if err := m.growState(s, n); err != nil {
		return nil, fmt.Errorf("model: deepseek_v4: %w", err)
	}
	if rows > s.logitRows {
		// The logits of the rows asked for only (a prompt's passes want one).
		s.scratch.finalLogits = b.NewBuffer(rows * cfg.VocabSize)
		if err := b.Sync(); err != nil {
			s.scratch.finalLogits, s.logitRows = nil, 0
			return nil, fmt.Errorf("model: deepseek_v4: allocating the logits of %d rows: %w", rows, err)
		}
		s.logitRows = rows
	}
	s.takeSnap()
	sc := &s.scratch
	view := func(buf backend.Buffer, width int) backend.Buffer { return b.View(buf, 0, n*width) }
	x, emb := view(sc.x, nh*D), view(sc.emb, D)

	if held != nil {
		m.pipe.EmbedToken(emb, m.embed, held)
	} else {
		b.Embed(emb, m.embed, tokens)
	}
	m.hc.MHCExpand(x, emb, n, nh, D)
	for l := range m.blocks {
		if err := ctx.Err(); err != nil {
			s.restoreSnap()
			return nil, err
		}
		blk := &m.blocks[l]
		// Attention site.
		c := m.hcPre(s, &blk.AttnHC, x, n)
		h := view(sc.h, D)
		b.RMSNorm(h, c, blk.Attn.AttnNorm, cfg.RMSNormEps)
		a := m.attention(s, blk, &s.layers[l], h, n, pos0)
		m.hc.MHCPost(x, x, a, view(sc.post, nh), view(sc.res, nh*nh), n, nh, D)
		// FFN site.
		c = m.hcPre(s, &blk.FFNHC, x, n)
		b.RMSNorm(h, c, blk.Attn.FFNNorm, cfg.RMSNormEps)
		f := m.moe(s, blk, h, tokens, held)
		m.hc.MHCPost(x, x, f, view(sc.post, nh), view(sc.res, nh*nh), n, nh, D)
	}
	if ms := s.mtp; ms != nil {
		// The block's next Draft reads the rows from its last entry on,
		// none older than its window; the window's rows are kept, so that
		// it can be rebuilt after a rollback past the block's entries.
		ms.saved.save(b, x, pos0, n, max(0, pos0+n-s.window()))
	}
	s.done += n

	xs := b.View(x, (n-rows)*nh*D, rows*nh*D)
	logits := b.View(sc.finalLogits, 0, rows*cfg.VocabSize)
	m.head(logits, b.View(sc.headLogits, 0, rows*nh), b.View(sc.final, 0, rows*D), xs, m.hcHeadFn, m.hcHeadBase, m.hcHeadScale, m.norm, rows)
	return logits, nil
}

// head collapses the streams xs ([rows, hc_mult*hidden]) with the hc_head
// parameters fn, base and scale, norms them with norm and writes the
// logits [rows, vocab]; hl [rows, hc_mult] and fin [rows, hidden] are
// scratch.
func (m *DeepseekV4) head(logits, hl, fin, xs backend.Buffer, fn backend.Weight, base backend.Buffer, scale float32, norm backend.Buffer, rows int) {
	b, cfg, v := m.b, m.cfg, m.v
	nh, D := v.HCMult, cfg.HiddenSize
	m.hc.MHCProject(hl, xs, fn, rows, cfg.RMSNormEps)
	m.hc.MHCHeadActivate(hl, base, scale, float32(v.HCEps), rows, nh)
	m.hc.MHCPre(fin, xs, hl, rows, nh, D)
	b.RMSNorm(fin, fin, norm, cfg.RMSNormEps)
	b.MatMul(logits, fin, m.lmHead, rows)
}

// hcPre computes a site's coefficients (left in the state's pre, post and
// res scratch) and returns the collapsed sub-layer input [n, hidden].
func (m *DeepseekV4) hcPre(s *v4State, site *v4HC, x backend.Buffer, n int) backend.Buffer {
	b, sc, nh, D := m.b, &s.scratch, m.v.HCMult, m.cfg.HiddenSize
	mix := m.mixer.Config().MixDim()
	logits := b.View(sc.logits, 0, n*mix)
	pre, post, res := b.View(sc.pre, 0, n*nh), b.View(sc.post, 0, n*nh), b.View(sc.res, 0, n*nh*nh)
	c := b.View(sc.c, 0, n*D)
	if f := m.fused; f != nil && m.mixer.Config().NormEps == m.cfg.RMSNormEps {
		f.MHCCoeffsPre(m.mixer, c, pre, post, res, logits, x, site.Fn, site.Base, site.Scale, n)
		return c
	}
	m.hc.MHCProject(logits, x, site.Fn, n, m.cfg.RMSNormEps)
	m.hc.MHCActivate(m.mixer, pre, post, res, logits, site.Base, site.Scale, n)
	m.hc.MHCPre(c, x, pre, n, nh, D)
	return c
}

// attention runs the attention of block blk (its cache ls) over h ([n,
// hidden], normed) at positions pos0.. and returns its output [n, hidden].
func (m *DeepseekV4) attention(s *v4State, blk *v4Block, ls *v4LayerState, h backend.Buffer, n, pos0 int) backend.Buffer {
	b, cfg, v, sc := m.b, m.cfg, m.v, &s.scratch
	H, hd, eps := cfg.NumHeads, v.HeadDim, cfg.RMSNormEps
	rope := m.compRoPE
	if blk.kind == v4Sliding {
		rope = m.mainRoPE
	}
	off := hd - rope.Dim()

	// Queries: a low-rank projection, normed, expanded to the heads and
	// normed per head (unweighted), then rotated on their last rope dims.
	// The norm goes to a buffer of its own (qres then normed into qn, not
	// in place), so that a backend that normalizes a matmul's input while
	// staging it takes it into the WQB matmul (kernels' fusion pass: one
	// launch fewer a layer).
	qres, qn := b.View(sc.qres, 0, n*v.QLoraRank), b.View(sc.qn, 0, n*v.QLoraRank)
	b.MatMul(qres, h, blk.Attn.WQA, n)
	b.RMSNorm(qn, qres, blk.Attn.QNorm, eps)
	q := b.View(sc.q, 0, n*H*hd)
	b.MatMul(q, qn, blk.Attn.WQB, n)
	b.RMSNorm(q, q, m.ones, eps)
	b.RoPE(q, n, H, hd, off, pos0, rope, false)

	// The one key (= value) head of the new rows goes straight after the
	// cached window rows, which move to the other buffer's front first if
	// they would not fit; normed and rotated likewise.
	ls.cur, ls.start = m.slide(ls.cur, ls.start, ls.win, n, hd, &ls.local)
	local := b.View(ls.local[ls.cur], ls.start*hd, (ls.win+n)*hd)
	kv := b.View(local, ls.win*hd, n*hd)
	b.MatMul(kv, h, blk.Attn.WKV, n)
	b.RMSNorm(kv, kv, blk.Attn.KVNorm, eps)
	b.RoPE(kv, n, 1, hd, off, pos0, rope, false)

	// The compressors' projections of h, and the indexer's head weights.
	var iw backend.Buffer
	switch blk.kind {
	case v4HCA:
		m.compressProject(ls.comp, blk.Comp, h, n)
	case v4CSA:
		m.compressProject(ls.comp, blk.Comp, h, n)
		m.compressProject(ls.index, blk.Indexer.Comp, h, n)
		iw = b.View(sc.iw, 0, n*v.IndexNHeads)
		b.MatMul(iw, h, blk.Indexer.WeightsProj, n)
	}

	args := dsv4.AttnArgs{M: n, Heads: H, Dim: hd, Pos0: pos0, Lo: pos0 - ls.win, Window: s.window(),
		Scale: float32(1 / math.Sqrt(float64(hd)))}
	var comp, idx backend.Buffer
	switch blk.kind {
	case v4HCA:
		m.compressPool(ls.comp, blk.Comp, n)
		comp = ls.comp.entries
		args.Rate, args.Entries = blk.rate, ls.comp.count
	case v4CSA:
		m.compressPool(ls.comp, blk.Comp, n)
		m.compressPool(ls.index, blk.Indexer.Comp, n)
		comp = ls.comp.entries
		args.Rate, args.Entries, args.TopK = blk.rate, ls.comp.count, s.indexTopK()
		idx = b.View(sc.idx, 0, n*s.indexTopK())
		m.indexer(s, blk, ls.index, qn, iw, idx, n, pos0)
	}
	att := b.View(sc.att, 0, n*H*hd)
	m.ops.CompressedAttention(att, q, local, comp, idx, blk.Attn.Sinks, args)

	// Keep the last sliding_window-1 rows (and the extra ones a rollback
	// needs) for the next call, where they are.
	keep := min(s.window()-1+ls.extra, ls.win+n)
	ls.start, ls.win = ls.start+ls.win+n-keep, keep

	// Undo the rotation on the output, then the grouped low-rank projection.
	b.RoPE(att, n, H, hd, off, pos0, rope, true)
	u := b.View(sc.u, 0, n*v.OGroups*v.OLoraRank)
	m.ops.GroupedMatMul(u, att, blk.WOA, n)
	out := b.View(sc.a, 0, n*cfg.HiddenSize)
	b.MatMul(out, u, blk.Attn.WOB, n)
	return out
}

// compressProject is a compressor's first half over the n new rows of h:
// their projections, after the kept rows (moved to the other buffer's front
// first if the new rows would not fit).
func (m *DeepseekV4) compressProject(c *v4Comp, w *v4Compressor, h backend.Buffer, n int) {
	b, rw := m.b, c.rowWidth
	keep := c.prev + c.tail
	c.cur, c.start = m.slide(c.cur, c.start, keep, n, rw, &c.kv, &c.gate)
	at := (c.start + keep) * rw
	b.MatMul(b.View(c.kv[c.cur], at, n*rw), h, w.WKV, n)
	b.MatMul(b.View(c.gate[c.cur], at, n*rw), h, w.WGate, n)
}

// compressPool is its second half: pools every window the n new rows close
// into new entries, and keeps the rows the next call needs.
func (m *DeepseekV4) compressPool(c *v4Comp, w *v4Compressor, n int) {
	b, rw := m.b, c.rowWidth
	kv, gate := c.kv[c.cur], c.gate[c.cur]
	base := c.start * rw
	total := c.tail + n
	windows := total / w.rate
	if windows == 0 {
		c.tail = total
		return
	}
	if c.count+windows > c.maxCount {
		// Cannot happen within capacity (count*rate <= positions); guard the buffer anyway.
		panic(fmt.Sprintf("model: deepseek_v4 compressor overflow: %d entries past %d", c.count+windows, c.maxCount))
	}
	a := dsv4.CompressArgs{Entries: windows, Rate: w.rate, Width: w.width, Overlap: w.csa, Prev: c.prev > 0,
		Pos0: c.count * w.rate, Eps: m.cfg.RMSNormEps, RoPE: m.compRoPE}
	src := a.SourceRows() * rw
	m.ops.CompressKV(b.View(c.entries, c.count*w.width, windows*w.width), b.View(kv, base, src), b.View(gate, base, src),
		w.APE, w.Norm, a)
	c.count += windows
	// Keep the last closed window (CSA) and the tail, where they are.
	first := c.prev + windows*w.rate // first row after the closed windows
	prev := 0
	if w.csa {
		prev = w.rate
		first -= w.rate
	}
	c.start, c.prev, c.tail = c.start+first, prev, total-windows*w.rate
}

// indexer selects each query's compressed entries (CSA) into idx [n,
// index_topk]; iw holds the head weights' projection of h.
func (m *DeepseekV4) indexer(s *v4State, blk *v4Block, ic *v4Comp, qres, iw, idx backend.Buffer, n, pos0 int) {
	b, v, sc := m.b, m.v, &s.scratch
	Hi, di := v.IndexNHeads, v.IndexHeadDim
	iq := b.View(sc.iq, 0, n*Hi*di)
	b.MatMul(iq, qres, blk.Indexer.WQB, n)
	b.RoPE(iq, n, Hi, di, di-m.compRoPE.Dim(), pos0, m.compRoPE, false)
	b.Scale(iw, iw, float32(math.Pow(float64(Hi), -0.5)))
	m.ops.CompressedIndexTopK(idx, iq, ic.entries, iw, dsv4.IndexArgs{
		M: n, Heads: Hi, Dim: di, Entries: ic.count, TopK: s.indexTopK(), Pos0: pos0, Rate: blk.rate,
		Scale: float32(math.Pow(float64(di), -0.5)),
	})
}

// moe runs the MoE block over h ([n, hidden], normed): the shared expert on
// all rows, then the routed experts, routed on the device (backend.RoutedMoEOps) for
// short chunks when the backend can, else on the host, each routed expert
// on its rows. held, when not nil, holds the one token's id on the device
// (forward's; runsHeld said the device routes every layer).
func (m *DeepseekV4) moe(s *v4State, blk *v4Block, h backend.Buffer, tokens []int32, held backend.Buffer) backend.Buffer {
	b, v, sc := m.b, m.v, &s.scratch
	n, D, I := len(tokens), m.cfg.HiddenSize, v.MoEIntermediateSize
	E, K := v.NRoutedExperts, v.NumExpertsPerTok

	// The shared expert, then the routed experts added to it.
	limit := float32(v.SwigluLimit)
	out := b.View(sc.moeOut, 0, n*D)
	sg, su := b.View(sc.sg, 0, n*I), b.View(sc.su, 0, n*I)
	blk.FFN.Shared.forward(b, out, sg, su, h, n, limit)

	router := b.View(sc.router, 0, n*E)
	b.MatMul(router, h, blk.FFN.Gate, n)
	route := dsv4.RouteArgs{M: n, Experts: E, K: K, Scoring: v.scoring, Scale: float32(v.RoutedScalingFactor)}
	if held != nil {
		if blk.hash == nil {
			m.moeOps.RoutedMoE(out, h, router, nil, blk.dev, route, limit)
			return out
		}
		ids := b.View(s.heldHash, 0, K)
		m.pipe.EmbedToken(ids, blk.hashTab, held)
		m.hashOps.RoutedMoEDeviceHash(out, h, router, ids, blk.dev, route, limit)
		return out
	}
	var hash []int32
	if blk.hash != nil {
		hash = make([]int32, n*K)
		for i, t := range tokens {
			copy(hash[i*K:(i+1)*K], blk.hash[int(t)*K:(int(t)+1)*K])
		}
	}
	if blk.dev != nil && n <= m.moeOps.MaxDeviceMoETokens() { // (nil where experts are on the host)
		m.moeOps.RoutedMoE(out, h, router, hash, blk.dev, route, limit)
		return out
	}

	logits := s.hostLog[:n*E]
	b.Read(logits, router, 0)
	idx, w := s.hostIdx[:n*K], s.hostW[:n*K]
	dsv4.Route(idx, w, logits, blk.FFN.Bias, hash, route)

	for e := range s.expRows {
		s.expRows[e], s.expScale[e] = s.expRows[e][:0], s.expScale[e][:0]
	}
	for i := 0; i < n; i++ {
		for j := 0; j < K; j++ {
			e := idx[i*K+j]
			s.expRows[e] = append(s.expRows[e], int32(i))
			s.expScale[e] = append(s.expScale[e], w[i*K+j])
		}
	}
	// The host experts are the last blk.host: h goes to the host before the
	// device experts are queued, so that the host computes while the device
	// runs its experts; their outputs are added after the device's, in
	// expert order as the all-device path adds them.
	first, hostRows := E-blk.host, 0
	for _, rows := range s.expRows[first:] {
		hostRows += len(rows)
	}
	if hostRows > 0 {
		b.Read(s.host.in[:n*D], h, 0)
	}
	for e, rows := range s.expRows[:first] {
		cnt := len(rows)
		if cnt == 0 {
			continue
		}
		xe := h
		if n > 1 {
			xe = b.View(sc.xe, 0, cnt*D)
			m.b.GatherRows(xe, h, rows, D)
		}
		ge, ue, ye := b.View(sc.ge, 0, cnt*I), b.View(sc.ue, 0, cnt*I), b.View(sc.ye, 0, cnt*D)
		blk.Experts[e].forward(b, ye, ge, ue, xe, cnt, limit)
		m.b.ScatterAddRows(out, ye, rows, s.expScale[e], D)
	}
	if hostRows > 0 {
		if f, ok := b.(interface{ Flush() }); ok {
			f.Flush() // the device's experts run while the host computes its own
		}
		off := m.runHostExperts(s, blk, n, first, limit)
		for e, rows := range s.expRows[first:] {
			if cnt := len(rows); cnt > 0 {
				b.ScatterAddRows(out, b.View(s.host.outDev, off[e]*D, cnt*D), rows, s.expScale[first+e], D)
			}
		}
	}
	return out
}
