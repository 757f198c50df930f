package model

import (
	"fmt"
	"strings"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// DeepSeek-V4 as released (deepseek-ai/DeepSeek-V4-Flash, -Pro and their
// -Base siblings; nvidia/DeepSeek-V4-Flash-NVFP4) is read as it ships, with
// no conversion step. Its names are DeepSeek's inference names, which the
// transformers checkpoint this model reads otherwise keeps below the layer
// level; they differ only at the top and in the attention's KV norm:
//
//	transformers (save_pretrained)      released
//	model.embed_tokens.weight           embed.weight
//	model.norm.weight                   norm.weight
//	model.hc_head.hc_{fn,base,scale}    hc_head_{fn,base,scale}
//	model.layers.N.attn.norm.weight     layers.N.attn.kv_norm.weight
//	model.layers.N.<rest>               layers.N.<rest>
//	head.weight                         head.weight
//
// The linears are FP8 E4M3 with a 128x128-tile ".scale" (F8_E8M0, or F32 in
// -Base), the routed experts MXFP4 (I8 codes, F8_E8M0 ".scale" per 32
// inputs) or, in NVIDIA's, ModelOpt NVFP4; Loader.hostLinear tells them
// apart by their tensors. The MTP block (mtp.0.*), which transformers does
// not read, is read only with Options.MTP (mtp.go).

// v4ReleasedNames returns the renaming for a checkpoint in the released
// layout (it has embed.weight and no model.embed_tokens.weight), or nil for
// transformers' layout.
func v4ReleasedNames(ck *weights.Checkpoint) func(string) string {
	if ck.Has("model.embed_tokens.weight") || !ck.Has("embed.weight") {
		return nil
	}
	return func(n string) string {
		r := nvfp4ckpt.V4ReleasedName(n)
		if strings.HasSuffix(r, ".attn.kv_norm.weight") && !ck.Has(r) && ck.Has(strings.TrimPrefix(n, "model.")) {
			return strings.TrimPrefix(n, "model.") // a checkpoint that kept transformers' attn.norm
		}
		return r
	}
}

// checkExpertFormat holds a routed expert (its tensors under prefix, as the
// architecture names them) to the config's expert_dtype and moe_quant_algo
// when they are given: "fp4" is MXFP4 (or NVFP4 where moe_quant_algo says
// so), "fp8" FP8 block-scaled. A contradiction is an ErrConfig naming the
// tensor and the field.
func (v *v4Config) checkExpertFormat(l *Loader, prefix string) error {
	want, field, value := backend.Format(0), "expert_dtype", v.ExpertDType
	switch strings.ToLower(v.ExpertDType) {
	case "":
	case "fp4":
		want = backend.MXFP4
	case "fp8":
		want = backend.FP8Block
	default:
		return configErr(l.ck.Dir()+"/config.json", "expert_dtype", "%q is not fp4 or fp8", v.ExpertDType)
	}
	if strings.EqualFold(v.MoEQuantAlgo, "NVFP4") {
		want, field, value = backend.NVFP4, "moe_quant_algo", v.MoEQuantAlgo
	}
	if want == 0 {
		return nil
	}
	for _, w := range []string{"w1", "w3", "w2"} {
		// The stored format, not the bound weight's: a backend may keep it
		// in another (the GPU re-blocks MXFP4 into NVFP4).
		got, err := l.storedFormat(prefix + w)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%w: %s: field %q is %q, but tensor %q is stored as %s, not %s",
				ErrConfig, l.ck.Dir(), field, value, l.name(prefix+w+".weight"), got, want)
		}
	}
	return nil
}
