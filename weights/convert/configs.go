package convert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// producerName is written to hf_quant_config.json and quantization_config.
const producerName = "manifold-convert"

// skipCopy reports whether a top-level input file is not copied: weights
// (rewritten), configs rewritten here, and other weight formats.
func skipCopy(name string) bool {
	if strings.HasPrefix(name, ".") {
		return true
	}
	switch name {
	case weights.IndexFileName, nvfp4ckpt.HFQuantConfigFile, nvfp4ckpt.ConfigFile:
		return true
	}
	for _, ext := range []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".npz"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// writeConfigs copies the input's config and tokenizer files into out,
// writes hf_quant_config.json, and writes config.json with its
// quantization_config replaced by the NVFP4 one (key order kept).
func writeConfigs(in, out string, exclude []string) error {
	ents, err := os.ReadDir(in)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || skipCopy(e.Name()) {
			continue
		}
		if err := copyFile(filepath.Join(in, e.Name()), filepath.Join(out, e.Name())); err != nil {
			return err
		}
	}
	if exclude == nil {
		exclude = []string{}
	}
	producer := map[string]string{"name": producerName, "version": "1"}
	hf := map[string]any{
		"producer": producer,
		"quantization": map[string]any{
			"quant_algo":          nvfp4ckpt.AlgoNVFP4,
			"kv_cache_quant_algo": nil,
			"group_size":          16,
			"exclude_modules":     exclude,
		},
	}
	data, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, nvfp4ckpt.HFQuantConfigFile), append(data, '\n'), 0o644); err != nil {
		return err
	}

	cfgPath := filepath.Join(in, nvfp4ckpt.ConfigFile)
	raw, err := os.ReadFile(cfgPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no config.json to annotate
	}
	if err != nil {
		return err
	}
	qc := map[string]any{
		"quant_method":    "modelopt",
		"quant_algo":      nvfp4ckpt.AlgoNVFP4,
		"group_size":      16,
		"exclude_modules": exclude,
		"ignore":          exclude,
		"producer":        producer,
		"config_groups": map[string]any{"group_0": map[string]any{
			"weights": map[string]any{"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
			"targets": []string{"Linear"},
		}},
	}
	qraw, err := json.Marshal(qc)
	if err != nil {
		return err
	}
	edited, err := setJSONKeys(raw, []kv{
		{"quantization_config", qraw},
		{"dtype", json.RawMessage(`"bfloat16"`)},
		{"torch_dtype", json.RawMessage(`"bfloat16"`)},
		// DeepSeek-V4's released configs describe their experts (MXFP4, or
		// NVIDIA's NVFP4); the output's are NVFP4 like every linear.
		{"expert_dtype", nil},
		{"moe_quant_algo", nil},
	})
	if err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	return os.WriteFile(filepath.Join(out, nvfp4ckpt.ConfigFile), edited, 0o644)
}

type kv struct {
	key string
	val json.RawMessage
}

// setJSONKeys rewrites the top-level object raw: quantization_config is set
// (added at the end if missing); the other keys are replaced only if
// present, and deleted where the new value is nil. Key order and other
// values are kept.
func setJSONKeys(raw []byte, set []kv) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	vals := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("bad key %v", tok)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := vals[k]; dup {
			return nil, fmt.Errorf("duplicate key %q", k)
		}
		keys = append(keys, k)
		vals[k] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	for _, s := range set {
		if s.val == nil { // delete
			if _, ok := vals[s.key]; ok {
				delete(vals, s.key)
				keys = slices.DeleteFunc(keys, func(k string) bool { return k == s.key })
			}
			continue
		}
		if _, ok := vals[s.key]; !ok {
			if s.key != "quantization_config" {
				continue
			}
			keys = append(keys, s.key)
		}
		vals[s.key] = s.val
	}
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, k := range keys {
		name, _ := json.Marshal(k)
		b.WriteString("  ")
		b.Write(name)
		b.WriteString(": ")
		var ind bytes.Buffer
		if err := json.Indent(&ind, vals[k], "  ", "  "); err != nil {
			return nil, err
		}
		b.Write(ind.Bytes())
		if i < len(keys)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
