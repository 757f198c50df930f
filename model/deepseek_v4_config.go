package model

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// maxSinkhornIters bounds hc_sinkhorn_iters: every token runs that many
// normalizations per mixing matrix (DeepSeek-V4 uses 20, and the iteration
// has converged long before 1000), so a larger count is a broken config, not
// a slow model.
const maxSinkhornIters = 1000

// DeepSeek-V4's layer kinds (config layer_types and mlp_layer_types).
const (
	v4Sliding    = "sliding_attention"
	v4CSA        = "compressed_sparse_attention"
	v4HCA        = "heavily_compressed_attention"
	v4MoE        = "moe"
	v4HashMoE    = "hash_moe"
	v4DefaultHCA = 128
	v4DefaultCSA = 4
)

// v4Config is the part of config.json that DeepSeek-V4 adds, with the
// defaults and legacy folding of transformers' DeepseekV4Config.__post_init__.
type v4Config struct {
	HeadDim             int                        `json:"head_dim"`
	QLoraRank           int                        `json:"q_lora_rank"`
	OGroups             int                        `json:"o_groups"`
	OLoraRank           int                        `json:"o_lora_rank"`
	SlidingWindow       int                        `json:"sliding_window"`
	IndexNHeads         int                        `json:"index_n_heads"`
	IndexHeadDim        int                        `json:"index_head_dim"`
	IndexTopK           int                        `json:"index_topk"`
	HCMult              int                        `json:"hc_mult"`
	HCSinkhornIters     int                        `json:"hc_sinkhorn_iters"`
	HCEps               float64                    `json:"hc_eps"`
	HCResidual          string                     `json:"hc_residual"` // not transformers': "lite" selects mHC-lite
	CompressRates       map[string]int             `json:"compress_rates"`
	CompressRopeTheta   float64                    `json:"compress_rope_theta"`
	LayerTypes          []string                   `json:"layer_types"`
	MLPLayerTypes       []string                   `json:"mlp_layer_types"`
	NRoutedExperts      int                        `json:"n_routed_experts"`
	NSharedExperts      int                        `json:"n_shared_experts"`
	NumExpertsPerTok    int                        `json:"num_experts_per_tok"`
	MoEIntermediateSize int                        `json:"moe_intermediate_size"`
	ScoringFunc         string                     `json:"scoring_func"`
	RoutedScalingFactor float64                    `json:"routed_scaling_factor"`
	SwigluLimit         float64                    `json:"swiglu_limit"`
	HiddenAct           string                     `json:"hidden_act"`
	RopeTheta           float64                    `json:"rope_theta"`
	PartialRotaryFactor *float64                   `json:"partial_rotary_factor"`
	RopeParameters      map[string]json.RawMessage `json:"rope_parameters"`
	RopeScaling         map[string]json.RawMessage `json:"rope_scaling"` // legacy rope_parameters (the released config.json)

	// How the released checkpoints store the routed experts
	// (deepseek_v4_released.go): expert_dtype "fp4" (MXFP4) or "fp8" (FP8
	// block), absent in some revisions; NVIDIA's adds moe_quant_algo NVFP4.
	ExpertDType  string `json:"expert_dtype"`
	MoEQuantAlgo string `json:"moe_quant_algo"`

	// Legacy fields folded in as __post_init__ does.
	CompressRatios  []int `json:"compress_ratios"`
	CompressRateCSA *int  `json:"compress_rate_csa"`
	CompressRateHCA *int  `json:"compress_rate_hca"`
	NumHashLayers   *int  `json:"num_hash_layers"`
	QKRopeHeadDim   *int  `json:"qk_rope_head_dim"`

	// Derived.
	mainRoPE, compressRoPE layers.RoPEParams
	residual               mhc.Residual
	scoring                dsv4.Scoring
}

// parseV4Config reads DeepSeek-V4's fields from cfg.Raw. Absent fields take
// transformers' defaults; every error names the field.
func parseV4Config(cfg *Config) (*v4Config, error) {
	v := &v4Config{
		HeadDim: 512, QLoraRank: 1024, OGroups: 8, OLoraRank: 1024, SlidingWindow: 128,
		IndexNHeads: 64, IndexHeadDim: 128, IndexTopK: 512,
		HCMult: 4, HCSinkhornIters: 20, HCEps: 1e-6,
		CompressRopeTheta: 160000, NRoutedExperts: 256, NSharedExperts: 1, NumExpertsPerTok: 6,
		MoEIntermediateSize: 2048, ScoringFunc: "sqrtsoftplus", RoutedScalingFactor: 1.5,
		SwigluLimit: 10, HiddenAct: "silu", RopeTheta: 10000,
	}
	if err := json.Unmarshal(cfg.Raw, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, cfg.Path, err)
	}
	p := cfg.Path
	n := cfg.NumLayers

	// compress_rates, layer_types, mlp_layer_types.
	if v.CompressRates == nil {
		v.CompressRates = map[string]int{v4CSA: v4DefaultCSA, v4HCA: v4DefaultHCA}
	}
	if v.CompressRateCSA != nil {
		v.CompressRates[v4CSA] = *v.CompressRateCSA
	}
	if v.CompressRateHCA != nil {
		v.CompressRates[v4HCA] = *v.CompressRateHCA
	}
	if v.LayerTypes == nil && v.CompressRatios != nil {
		for i, r := range v.CompressRatios {
			switch r {
			case 0:
				v.LayerTypes = append(v.LayerTypes, v4Sliding)
			case 4:
				v.LayerTypes = append(v.LayerTypes, v4CSA)
			case 128:
				v.LayerTypes = append(v.LayerTypes, v4HCA)
			default:
				return nil, configErr(p, "compress_ratios", "entry %d is %d; legacy ratios are 0, 4 or 128", i, r)
			}
		}
	}
	if v.LayerTypes == nil {
		for i := 0; i < n; i++ {
			switch {
			case i < 2:
				v.LayerTypes = append(v.LayerTypes, v4HCA)
			case (i-2)%2 == 1:
				v.LayerTypes = append(v.LayerTypes, v4CSA)
			default:
				v.LayerTypes = append(v.LayerTypes, v4HCA)
			}
		}
	}
	if len(v.LayerTypes) > n {
		v.LayerTypes = v.LayerTypes[:n]
	}
	if v.MLPLayerTypes == nil {
		hash := 3
		if v.NumHashLayers != nil {
			hash = *v.NumHashLayers
		}
		for i := 0; i < n; i++ {
			if i < hash {
				v.MLPLayerTypes = append(v.MLPLayerTypes, v4HashMoE)
			} else {
				v.MLPLayerTypes = append(v.MLPLayerTypes, v4MoE)
			}
		}
	}
	if len(v.MLPLayerTypes) > n {
		v.MLPLayerTypes = v.MLPLayerTypes[:n]
	}
	for _, f := range []struct {
		name    string
		types   []string
		allowed []string
	}{
		{"layer_types", v.LayerTypes, []string{v4Sliding, v4CSA, v4HCA}},
		{"mlp_layer_types", v.MLPLayerTypes, []string{v4HashMoE, v4MoE}},
	} {
		if len(f.types) != n {
			return nil, configErr(p, f.name, "has %d entries for num_hidden_layers %d", len(f.types), n)
		}
		for i, t := range f.types {
			if !slices.Contains(f.allowed, t) {
				return nil, configErr(p, f.name, "entry %d is %q; DeepSeek-V4 allows %v", i, t, f.allowed)
			}
		}
	}
	for _, t := range v.LayerTypes {
		if t != v4Sliding && v.CompressRates[t] <= 0 {
			return nil, configErr(p, "compress_rates", "%s needs a positive rate, got %d", t, v.CompressRates[t])
		}
	}

	// Sizes.
	for _, f := range []struct {
		name string
		v    int
	}{
		{"head_dim", v.HeadDim}, {"q_lora_rank", v.QLoraRank}, {"o_groups", v.OGroups}, {"o_lora_rank", v.OLoraRank},
		{"sliding_window", v.SlidingWindow}, {"hc_mult", v.HCMult}, {"n_routed_experts", v.NRoutedExperts},
		{"num_experts_per_tok", v.NumExpertsPerTok}, {"moe_intermediate_size", v.MoEIntermediateSize},
	} {
		if f.v <= 0 {
			return nil, configErr(p, f.name, "must be a positive integer, got %d", f.v)
		}
	}
	if slices.Contains(v.LayerTypes, v4CSA) {
		for _, f := range []struct {
			name string
			v    int
		}{{"index_n_heads", v.IndexNHeads}, {"index_head_dim", v.IndexHeadDim}, {"index_topk", v.IndexTopK}} {
			if f.v <= 0 {
				return nil, configErr(p, f.name, "must be a positive integer, got %d", f.v)
			}
		}
	}
	if (cfg.NumHeads*v.HeadDim)%v.OGroups != 0 {
		return nil, configErr(p, "o_groups", "%d does not divide num_attention_heads*head_dim = %d", v.OGroups, cfg.NumHeads*v.HeadDim)
	}
	if v.NumExpertsPerTok > v.NRoutedExperts {
		return nil, configErr(p, "num_experts_per_tok", "%d exceeds n_routed_experts %d", v.NumExpertsPerTok, v.NRoutedExperts)
	}
	if v.HiddenAct != "silu" {
		return nil, configErr(p, "hidden_act", "%q is not supported (silu only)", v.HiddenAct)
	}
	var ok bool
	if v.scoring, ok = dsv4.ParseScoring(v.ScoringFunc); !ok {
		return nil, configErr(p, "scoring_func", "%q is not supported (sqrtsoftplus, sigmoid)", v.ScoringFunc)
	}
	var err error
	if v.residual, err = mhc.ParseResidual(v.HCResidual); err != nil {
		return nil, configErr(p, "hc_residual", "%v", err)
	}
	if (v.HCSinkhornIters < 1 || v.HCSinkhornIters > maxSinkhornIters) && v.residual == mhc.Sinkhorn {
		return nil, configErr(p, "hc_sinkhorn_iters", "must be in [1, %d], got %d", maxSinkhornIters, v.HCSinkhornIters)
	}
	if !(v.HCEps >= 0 && finiteFloat32(v.HCEps)) {
		return nil, configErr(p, "hc_eps", "must be a finite number >= 0, got %g", v.HCEps)
	}
	if !finiteFloat32(v.RoutedScalingFactor) {
		return nil, configErr(p, "routed_scaling_factor", "must be a finite number, got %g", v.RoutedScalingFactor)
	}

	// Rotary embeddings: nested {main, compress} as written by transformers,
	// or built from the flat fields as __post_init__ does.
	partial := 64.0 / 512.0
	if v.PartialRotaryFactor != nil {
		partial = *v.PartialRotaryFactor
	} else if v.QKRopeHeadDim != nil {
		partial = float64(*v.QKRopeHeadDim) / float64(v.HeadDim)
	}
	if v.RopeParameters == nil {
		v.RopeParameters = v.RopeScaling // transformers folds the legacy name in
	}
	rawMain, okMain := v.RopeParameters["main"]
	rawComp, okComp := v.RopeParameters["compress"]
	if okMain && okComp && isObject(rawMain) && isObject(rawComp) {
		if v.mainRoPE, err = ParseRoPE(rawMain, v.RopeTheta); err != nil {
			return nil, configErr(p, "rope_parameters.main", "%v", err)
		}
		if v.compressRoPE, err = ParseRoPE(rawComp, v.CompressRopeTheta); err != nil {
			return nil, configErr(p, "rope_parameters.compress", "%v", err)
		}
	} else {
		v.mainRoPE = layers.RoPEParams{Type: "default", Theta: v.RopeTheta, PartialRotaryFactor: partial}
		flat, _ := json.Marshal(v.RopeParameters)
		if v.compressRoPE, err = ParseRoPE(flat, v.CompressRopeTheta); err != nil {
			return nil, configErr(p, "rope_parameters", "%v", err)
		}
		v.compressRoPE.Theta = v.CompressRopeTheta
		v.compressRoPE.PartialRotaryFactor = partial
		if v.compressRoPE.Type == "yarn" && v.compressRoPE.AttentionFactor == 0 {
			v.compressRoPE.AttentionFactor = 1 // V4 forces it: the reference does not scale cos/sin
		}
	}
	v.mainRoPE.MaxPositionEmbeddings = float64(cfg.MaxPositionEmbeddings)
	v.compressRoPE.MaxPositionEmbeddings = float64(cfg.MaxPositionEmbeddings)
	return v, nil
}

func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

// rate is the compression rate of a layer kind (0 for sliding layers).
func (v *v4Config) rate(layerType string) int {
	if layerType == v4Sliding {
		return 0
	}
	return v.CompressRates[layerType]
}
