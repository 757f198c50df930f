package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// weightBytes is the checkpoint's share of the bytes a decode step reads
// (see the package doc), and its size.
type weightBytes struct {
	perToken   int64 // the weights a step reads, the embedding row aside
	embedRow   int64 // one row of the embedding table
	checkpoint int64 // every tensor's bytes
	experts    string
}

// routedExpert matches a routed expert's tensor (not a shared expert's:
// "shared_experts." has no dot before "experts").
var routedExpert = regexp.MustCompile(`\.experts\.(\d+)\.`)

// countWeights reads the checkpoint's tensor list (not its data) and counts
// what a decode step reads of it.
func countWeights(dir string, cfg *model.Config) (weightBytes, error) {
	ck, err := weights.Open(dir)
	if err != nil {
		return weightBytes{}, err
	}
	defer ck.Close()
	tied := cfg.TieWordEmbeddings && !ck.Has("lm_head.weight") && !ck.Has("head.weight")
	var w weightBytes
	var expertBytes int64
	experts := map[int]bool{}
	for _, name := range ck.Names() {
		t, err := ck.Tensor(name)
		if err != nil {
			return weightBytes{}, err
		}
		n := int64(len(t.Data)) // the mapping's length: nothing is read
		w.checkpoint += n
		switch {
		case (strings.HasSuffix(name, "embed_tokens.weight") || name == "embed.weight") && len(t.Shape) == 2: // HF's name, DeepSeek's
			if t.Shape[0] > 0 {
				w.embedRow = n / int64(t.Shape[0])
			}
			if tied {
				w.perToken += n
			}
		case len(t.Shape) < 2:
		case routedExpert.MatchString(name):
			// Before the integer test: DeepSeek-V4's MXFP4 experts are I8
			// (packed E2M1 codes), and they are what a step reads most of.
			expertBytes += n
			e, _ := strconv.Atoi(routedExpert.FindStringSubmatch(name)[1])
			experts[e] = true
		case isInteger(t.DType):
		default:
			w.perToken += n
		}
	}
	if expertBytes > 0 {
		total, k := moeConfig(cfg)
		if total <= 0 {
			total = len(experts)
		}
		if k <= 0 || k > total {
			return weightBytes{}, fmt.Errorf("%s: routed experts in the checkpoint but no usable num_experts_per_tok (%d of %d experts) in config.json", dir, k, total)
		}
		w.perToken += expertBytes * int64(k) / int64(total)
		w.experts = fmt.Sprintf("%d of %d routed experts", k, total)
	}
	return w, nil
}

// isInteger reports index and table dtypes (U8 is not one: it holds NVFP4's
// packed codes; I8 is one except in a routed expert, where it holds
// MXFP4's).
func isInteger(d weights.DType) bool {
	switch d {
	case weights.I8, weights.I16, weights.I32, weights.I64, weights.U16, weights.U32, weights.U64, weights.Bool:
		return true
	}
	return false
}

// moeConfig reads the routed expert count and top-k from config.json.
func moeConfig(cfg *model.Config) (experts, topK int) {
	var raw struct {
		NRoutedExperts   int `json:"n_routed_experts"`
		NumExperts       int `json:"num_experts"`
		NumLocalExperts  int `json:"num_local_experts"`
		NumExpertsPerTok int `json:"num_experts_per_tok"`
	}
	if len(cfg.Raw) == 0 || json.Unmarshal(cfg.Raw, &raw) != nil {
		return 0, 0
	}
	return max(raw.NRoutedExperts, raw.NumExperts, raw.NumLocalExperts), raw.NumExpertsPerTok
}
