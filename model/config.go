package model

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/weights"
)

// Config holds the fields of config.json that every architecture shares. The
// whole file is kept in Raw so an architecture can read its own fields.
type Config struct {
	Path         string // the config.json it was read from
	ModelType    string // model_type
	Architecture string // architectures[0], may be empty

	HiddenSize            int
	IntermediateSize      int
	NumLayers             int
	NumHeads              int
	NumKVHeads            int
	HeadDim               int
	VocabSize             int
	MaxPositionEmbeddings int
	RMSNormEps            float32
	TieWordEmbeddings     bool
	AttentionBias         bool
	MLPBias               bool
	HiddenAct             string
	DType                 string   // dtype (or torch_dtype): the checkpoint's compute dtype in transformers
	SlidingWindow         int      // 0: none
	UseSlidingWindow      bool     // Qwen-style switch for SlidingWindow
	LayerTypes            []string // per layer, when given
	RoPE                  layers.RoPEParams

	BOSTokenIDs []int
	EOSTokenIDs []int

	Raw json.RawMessage
}

// finiteFloat32 reports whether v is a number that float32 holds finitely
// (not NaN, not past float32's range): the configs' scale factors and
// epsilons are used in float32.
func finiteFloat32(v float64) bool { return math.Abs(v) <= math.MaxFloat32 }

// ErrConfig is wrapped by every config error.
var ErrConfig = errors.New("bad model config")

func configErr(path, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: field %q: %s", ErrConfig, path, field, fmt.Sprintf(format, args...))
}

// rawConfig mirrors config.json with pointers where absence matters.
type rawConfig struct {
	ModelType             string           `json:"model_type"`
	Architectures         []string         `json:"architectures"`
	HiddenSize            int              `json:"hidden_size"`
	IntermediateSize      int              `json:"intermediate_size"`
	NumLayers             int              `json:"num_hidden_layers"`
	NumHeads              int              `json:"num_attention_heads"`
	NumKVHeads            *int             `json:"num_key_value_heads"`
	HeadDim               *int             `json:"head_dim"`
	VocabSize             int              `json:"vocab_size"`
	MaxPositionEmbeddings int              `json:"max_position_embeddings"`
	RMSNormEps            *float64         `json:"rms_norm_eps"`
	TieWordEmbeddings     *bool            `json:"tie_word_embeddings"`
	AttentionBias         bool             `json:"attention_bias"`
	MLPBias               bool             `json:"mlp_bias"`
	HiddenAct             string           `json:"hidden_act"`
	DType                 string           `json:"dtype"`
	TorchDType            string           `json:"torch_dtype"`
	SlidingWindow         *int             `json:"sliding_window"`
	UseSlidingWindow      *bool            `json:"use_sliding_window"`
	LayerTypes            []string         `json:"layer_types"`
	RopeTheta             *float64         `json:"rope_theta"`
	RopeParameters        json.RawMessage  `json:"rope_parameters"`
	RopeScaling           json.RawMessage  `json:"rope_scaling"`
	PartialRotaryFactor   *float64         `json:"partial_rotary_factor"`
	BOSTokenID            json.RawMessage  `json:"bos_token_id"`
	EOSTokenID            json.RawMessage  `json:"eos_token_id"`
	TextConfig            *json.RawMessage `json:"text_config"`
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := weights.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: reading config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig parses the contents of a config.json; path is used in errors.
func ParseConfig(path string, data []byte) (*Config, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	c := &Config{
		Path:                  path,
		ModelType:             r.ModelType,
		HiddenSize:            r.HiddenSize,
		IntermediateSize:      r.IntermediateSize,
		NumLayers:             r.NumLayers,
		NumHeads:              r.NumHeads,
		VocabSize:             r.VocabSize,
		MaxPositionEmbeddings: r.MaxPositionEmbeddings,
		RMSNormEps:            1e-6,
		TieWordEmbeddings:     true, // transformers' PreTrainedConfig default
		AttentionBias:         r.AttentionBias,
		MLPBias:               r.MLPBias,
		HiddenAct:             r.HiddenAct,
		DType:                 cmp.Or(r.DType, r.TorchDType, "float32"),
		LayerTypes:            r.LayerTypes,
		Raw:                   json.RawMessage(data),
	}
	if len(r.Architectures) > 0 {
		c.Architecture = r.Architectures[0]
	}
	if c.ModelType == "" {
		return nil, configErr(path, "model_type", "missing; supported: %s", strings.Join(Supported(), ", "))
	}
	if _, ok := architectures[c.ModelType]; !ok {
		return nil, configErr(path, "model_type", "unknown architecture %q (architectures %v); supported: %s",
			c.ModelType, r.Architectures, strings.Join(Supported(), ", "))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", r.HiddenSize}, {"num_hidden_layers", r.NumLayers}, {"num_attention_heads", r.NumHeads}, {"vocab_size", r.VocabSize}} {
		if f.v <= 0 {
			return nil, configErr(path, f.name, "must be a positive integer, got %d", f.v)
		}
	}
	c.NumKVHeads = c.NumHeads
	if r.NumKVHeads != nil {
		c.NumKVHeads = *r.NumKVHeads
	}
	if c.NumKVHeads <= 0 || c.NumHeads%c.NumKVHeads != 0 {
		return nil, configErr(path, "num_key_value_heads", "%d must divide num_attention_heads %d", c.NumKVHeads, c.NumHeads)
	}
	c.HeadDim = c.HiddenSize / c.NumHeads
	if r.HeadDim != nil && *r.HeadDim > 0 {
		c.HeadDim = *r.HeadDim
	}
	if r.RMSNormEps != nil {
		c.RMSNormEps = float32(*r.RMSNormEps)
		if !(*r.RMSNormEps >= 0 && finiteFloat32(*r.RMSNormEps)) {
			return nil, configErr(path, "rms_norm_eps", "must be a finite number >= 0, got %g", *r.RMSNormEps)
		}
	}
	if r.TieWordEmbeddings != nil {
		c.TieWordEmbeddings = *r.TieWordEmbeddings
	}
	if r.SlidingWindow != nil {
		c.SlidingWindow = *r.SlidingWindow
	}
	if r.UseSlidingWindow != nil {
		c.UseSlidingWindow = *r.UseSlidingWindow
	}
	if len(c.LayerTypes) != 0 && len(c.LayerTypes) != c.NumLayers {
		return nil, configErr(path, "layer_types", "has %d entries for %d layers", len(c.LayerTypes), c.NumLayers)
	}
	var err error
	if c.BOSTokenIDs, err = tokenIDs(r.BOSTokenID); err != nil {
		return nil, configErr(path, "bos_token_id", "%v", err)
	}
	if c.EOSTokenIDs, err = tokenIDs(r.EOSTokenID); err != nil {
		return nil, configErr(path, "eos_token_id", "%v", err)
	}
	rope := r.RopeParameters
	if len(rope) == 0 || string(rope) == "null" {
		rope = r.RopeScaling
	}
	theta := 10000.0
	if r.RopeTheta != nil {
		theta = *r.RopeTheta
	}
	c.RoPE, err = ParseRoPE(rope, theta)
	if err != nil {
		return nil, configErr(path, "rope_parameters", "%v", err)
	}
	if c.RoPE.PartialRotaryFactor == 0 && r.PartialRotaryFactor != nil {
		c.RoPE.PartialRotaryFactor = *r.PartialRotaryFactor
	}
	c.RoPE.MaxPositionEmbeddings = float64(c.MaxPositionEmbeddings)
	return c, nil
}

// ParseRoPE reads one rope_parameters (or rope_scaling) object. A missing
// object means default RoPE with the given theta. Objects nested by layer kind
// (as DeepSeek-V4 writes them) are left to the architecture: ParseRoPE returns
// the defaults for them.
func ParseRoPE(raw json.RawMessage, theta float64) (layers.RoPEParams, error) {
	p := layers.RoPEParams{Type: "default", Theta: theta}
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return p, err
	}
	if _, flat := m["rope_type"]; !flat {
		if _, flat = m["type"]; !flat {
			if _, flat = m["rope_theta"]; !flat {
				return p, nil
			}
		}
	}
	var r struct {
		RopeType            string   `json:"rope_type"`
		Type                string   `json:"type"`
		RopeTheta           *float64 `json:"rope_theta"`
		Factor              float64  `json:"factor"`
		LowFreqFactor       float64  `json:"low_freq_factor"`
		HighFreqFactor      float64  `json:"high_freq_factor"`
		OriginalMax         float64  `json:"original_max_position_embeddings"`
		BetaFast            float64  `json:"beta_fast"`
		BetaSlow            float64  `json:"beta_slow"`
		AttentionFactor     float64  `json:"attention_factor"`
		Mscale              float64  `json:"mscale"`
		MscaleAllDim        float64  `json:"mscale_all_dim"`
		Truncate            *bool    `json:"truncate"`
		PartialRotaryFactor float64  `json:"partial_rotary_factor"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return p, err
	}
	p.Type = r.RopeType
	if p.Type == "" {
		p.Type = r.Type
	}
	if p.Type == "" {
		p.Type = "default"
	}
	if r.RopeTheta != nil {
		p.Theta = *r.RopeTheta
	}
	p.Factor, p.LowFreqFactor, p.HighFreqFactor = r.Factor, r.LowFreqFactor, r.HighFreqFactor
	p.OriginalMaxPositions, p.BetaFast, p.BetaSlow = r.OriginalMax, r.BetaFast, r.BetaSlow
	p.AttentionFactor, p.Mscale, p.MscaleAllDim = r.AttentionFactor, r.Mscale, r.MscaleAllDim
	p.Truncate, p.PartialRotaryFactor = r.Truncate, r.PartialRotaryFactor
	return p, nil
}

// tokenIDs reads a token id field that may be null, a number or a list.
func tokenIDs(raw json.RawMessage) ([]int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want an integer or a list of integers, got %s", raw)
	}
	return many, nil
}

// GenerationConfig is generation_config.json: the checkpoint's own defaults.
type GenerationConfig struct {
	EOSTokenIDs       []int
	BOSTokenIDs       []int
	DoSample          bool
	Temperature       float64
	TopK              int
	TopP              float64
	MinP              float64
	RepetitionPenalty float64
	MaxNewTokens      int
}

// LoadGenerationConfig reads dir/generation_config.json; a missing file gives
// the zero value and no error.
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	path := filepath.Join(dir, "generation_config.json")
	data, err := weights.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &GenerationConfig{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	var r struct {
		EOS               json.RawMessage `json:"eos_token_id"`
		BOS               json.RawMessage `json:"bos_token_id"`
		DoSample          bool            `json:"do_sample"`
		Temperature       float64         `json:"temperature"`
		TopK              int             `json:"top_k"`
		TopP              float64         `json:"top_p"`
		MinP              float64         `json:"min_p"`
		RepetitionPenalty float64         `json:"repetition_penalty"`
		MaxNewTokens      int             `json:"max_new_tokens"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	g := &GenerationConfig{DoSample: r.DoSample, Temperature: r.Temperature, TopK: r.TopK, TopP: r.TopP,
		MinP: r.MinP, RepetitionPenalty: r.RepetitionPenalty, MaxNewTokens: r.MaxNewTokens}
	if g.EOSTokenIDs, err = tokenIDs(r.EOS); err != nil {
		return nil, configErr(path, "eos_token_id", "%v", err)
	}
	if g.BOSTokenIDs, err = tokenIDs(r.BOS); err != nil {
		return nil, configErr(path, "bos_token_id", "%v", err)
	}
	return g, nil
}

// Supported lists the model_type values this package runs, sorted.
func Supported() []string {
	return slices.Sorted(maps.Keys(architectures))
}

// NewRoPE builds a rotary embedding for heads of headDim channels from p.
// The inverse frequencies stay in float32 whatever the checkpoint's dtype, as
// transformers (its inv_freq buffer is float32 after from_pretrained of a
// bf16 or f16 checkpoint), vLLM and llama.cpp compute them: rounding them to
// bf16 shifts a rotation's phase by up to position × frequency × 2^-9.
func (c *Config) NewRoPE(p layers.RoPEParams, headDim int) (*layers.RoPE, error) {
	r, err := layers.NewRoPE(p, headDim)
	if err != nil {
		return nil, configErr(c.Path, "rope_parameters", "%v", err)
	}
	return r, nil
}
