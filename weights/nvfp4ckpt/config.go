package nvfp4ckpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/manifoldlm/manifold/weights"
)

// File names of the quantization config.
const (
	HFQuantConfigFile = "hf_quant_config.json"
	ConfigFile        = "config.json"
)

// Quantization algorithms this package understands (Config.Algo).
const (
	AlgoNVFP4    = "NVFP4"     // ModelOpt NVFP4: E2M1 weights, E4M3 block scales of 16, F32 global scale
	AlgoFP8Block = "FP8_BLOCK" // DeepSeek FP8: E4M3 weights, F32 weight_scale_inv per weight_block_size block
	// AlgoMixed is ModelOpt's MIXED_PRECISION (nvidia/DeepSeek-V4-Flash-NVFP4:
	// NVFP4 routed experts, the rest FP8 blocks as released): each linear's
	// format is read from its tensors.
	AlgoMixed = "MIXED_PRECISION"
)

// Config is a checkpoint's quantization config.
type Config struct {
	Algo      string   // AlgoNVFP4, AlgoFP8Block or AlgoMixed
	GroupSize int      // NVFP4: elements per block scale (always 16)
	BlockSize [2]int   // FP8 block: rows, columns per weight_scale_inv entry
	Exclude   []string // modules left unquantized: names or path.Match patterns
	Producer  string   // producer name, "" if not given
	File      string   // the file it was read from
}

// ReadConfig reads the quantization config of the checkpoint directory dir:
// hf_quant_config.json if present, else config.json's quantization_config.
// It returns (nil, nil) when neither has one (an unquantized checkpoint); a
// nil *Config quantizes nothing. An unknown algorithm gives an error wrapping
// ErrUnknownQuantAlgo, a malformed config one wrapping ErrBadConfig; both
// name the file.
func ReadConfig(dir string) (*Config, error) {
	hf := filepath.Join(dir, HFQuantConfigFile)
	data, err := weights.ReadFile(hf)
	switch {
	case err == nil:
		return ParseConfig(hf, data)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w", hf, err)
	}
	cf := filepath.Join(dir, ConfigFile)
	data, err = weights.ReadFile(cf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w", cf, err)
	}
	return ParseConfig(cf, data)
}

// rawQuant holds the fields of either config form.
type rawQuant struct {
	QuantMethod     string          `json:"quant_method"`
	QuantAlgo       *string         `json:"quant_algo"`
	GroupSize       *int            `json:"group_size"`
	ExcludeModules  []string        `json:"exclude_modules"`
	Ignore          []string        `json:"ignore"`
	WeightBlockSize []int           `json:"weight_block_size"`
	ConfigGroups    json.RawMessage `json:"config_groups"`
	Producer        json.RawMessage `json:"producer"`
}

// ParseConfig parses a quantization config. file names the source in errors
// and tells the form: hf_quant_config.json ({"producer", "quantization"}) or
// config.json ({"quantization_config": {...}}); any other name is tried as
// both. It returns (nil, nil) for a config.json without quantization_config.
func ParseConfig(file string, data []byte) (*Config, error) {
	var top struct {
		Quantization       json.RawMessage `json:"quantization"`
		QuantizationConfig json.RawMessage `json:"quantization_config"`
		Producer           json.RawMessage `json:"producer"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w: %v", file, ErrBadConfig, err)
	}
	body, producer := top.QuantizationConfig, json.RawMessage(nil)
	if filepath.Base(file) != ConfigFile && isObject(top.Quantization) {
		body, producer = top.Quantization, top.Producer
	}
	if !isObject(body) {
		if filepath.Base(file) == HFQuantConfigFile {
			return nil, fmt.Errorf("nvfp4ckpt: %s: %w: no \"quantization\" object", file, ErrBadConfig)
		}
		if len(body) == 0 || string(bytes.TrimSpace(body)) == "null" {
			return nil, nil
		}
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w: quantization_config is not an object", file, ErrBadConfig)
	}
	var q rawQuant
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w: %v", file, ErrBadConfig, err)
	}
	if producer == nil {
		producer = q.Producer
	}
	cfg := &Config{File: file, Producer: producerName(producer)}
	cfg.Exclude = append(append(cfg.Exclude, q.ExcludeModules...), q.Ignore...)
	for _, p := range cfg.Exclude {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("nvfp4ckpt: %s: %w: exclude pattern %q: %v", file, ErrBadConfig, p, err)
		}
	}
	algo := ""
	if q.QuantAlgo != nil {
		algo = strings.ToUpper(*q.QuantAlgo)
	}
	switch {
	case algo == AlgoNVFP4:
		cfg.Algo = AlgoNVFP4
		gs := 16
		if q.GroupSize != nil {
			gs = *q.GroupSize
		} else if g, ok := groupSizeFromGroups(q.ConfigGroups); ok {
			gs = g
		}
		if gs != 16 {
			return nil, fmt.Errorf("nvfp4ckpt: %s: %w: NVFP4 group_size %d (only 16 is defined)", file, ErrBadConfig, gs)
		}
		cfg.GroupSize = gs
	case algo == AlgoMixed:
		cfg.Algo = AlgoMixed
		cfg.BlockSize = DefaultFP8Block
		if len(q.WeightBlockSize) == 2 && q.WeightBlockSize[0] > 0 && q.WeightBlockSize[1] > 0 {
			cfg.BlockSize = [2]int{q.WeightBlockSize[0], q.WeightBlockSize[1]}
		}
	case algo == "" && strings.EqualFold(q.QuantMethod, "fp8") && q.WeightBlockSize != nil:
		if len(q.WeightBlockSize) != 2 || q.WeightBlockSize[0] <= 0 || q.WeightBlockSize[1] <= 0 {
			return nil, fmt.Errorf("nvfp4ckpt: %s: %w: weight_block_size %v (want two positive sizes)", file, ErrBadConfig, q.WeightBlockSize)
		}
		cfg.Algo = AlgoFP8Block
		cfg.BlockSize = [2]int{q.WeightBlockSize[0], q.WeightBlockSize[1]}
	case algo != "":
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w %q (supported: %s, %s)", file, ErrUnknownQuantAlgo, *q.QuantAlgo, AlgoNVFP4, AlgoMixed)
	default:
		return nil, fmt.Errorf("nvfp4ckpt: %s: %w: quant_method %q without a quant_algo (supported: quant_algo %s, or quant_method fp8 with weight_block_size)",
			file, ErrUnknownQuantAlgo, q.QuantMethod, AlgoNVFP4)
	}
	return cfg, nil
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

func producerName(raw json.RawMessage) string {
	var p struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &p) == nil {
		return p.Name
	}
	return ""
}

// groupSizeFromGroups reads config_groups.*.weights.group_size (the
// compressed-tensors form ModelOpt writes into config.json).
func groupSizeFromGroups(raw json.RawMessage) (int, bool) {
	var groups map[string]struct {
		Weights struct {
			GroupSize *int `json:"group_size"`
		} `json:"weights"`
	}
	if json.Unmarshal(raw, &groups) != nil {
		return 0, false
	}
	for _, g := range groups {
		if g.Weights.GroupSize != nil {
			return *g.Weights.GroupSize, true
		}
	}
	return 0, false
}

// IsQuantized reports whether the linear module (for example
// "model.layers.0.mlp.down_proj"; a trailing ".weight" is ignored) is NVFP4
// under c: the algorithm is NVFP4 and the module is not excluded. A module is
// excluded when an exclude entry equals it, matches it as a path.Match
// pattern ("model.layers.*.mlp.gate"), or names a module that contains it
// ("model.visual" excludes "model.visual.blocks.0.fc1"). Whether the
// checkpoint really holds NVFP4 tensors for it is Has's question.
func (c *Config) IsQuantized(module string) bool {
	if c == nil || c.Algo != AlgoNVFP4 {
		return false
	}
	return !c.Excluded(module)
}

// Excluded reports whether module matches an exclude entry (see IsQuantized).
func (c *Config) Excluded(module string) bool {
	if c == nil {
		return false
	}
	module = strings.TrimSuffix(module, ".weight")
	for _, p := range c.Exclude {
		for m := module; ; {
			if ok, _ := path.Match(p, m); ok || p == m {
				return true
			}
			i := strings.LastIndexByte(m, '.')
			if i < 0 {
				break
			}
			m = m[:i]
		}
	}
	return false
}
