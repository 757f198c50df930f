package testmodel

import (
	"fmt"

	"github.com/manifoldlm/manifold/weights"
)

// denseShapes are the real dense shapes of issue 57's matrix, each as
// NAME (NVFP4 linears, bf16 embeddings and head) and NAME-bf16 (every
// linear in bf16). The heads are untied (the released 0.6B to 4B Qwen3 and
// Llama-3.2 tie them): the same bytes a step reads either way.
var denseShapes = []struct {
	name, what string
	l          Llama
}{
	{"qwen3-0.6b", "Qwen3-0.6B: 28 layers, hidden 1024, FFN 3072, GQA 16/8 (heads of 128) with q/k norms, vocab 151936",
		Llama{Layers: 28, Hidden: 1024, FFN: 3072, Heads: 16, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6, Qwen3: true}},
	{"qwen3-1.7b", "Qwen3-1.7B: 28 layers, hidden 2048, FFN 6144, GQA 16/8 (heads of 128) with q/k norms, vocab 151936",
		Llama{Layers: 28, Hidden: 2048, FFN: 6144, Heads: 16, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6, Qwen3: true}},
	{"qwen3-4b", "Qwen3-4B: 36 layers, hidden 2560, FFN 9728, GQA 32/8 (heads of 128) with q/k norms, vocab 151936",
		Llama{Layers: 36, Hidden: 2560, FFN: 9728, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6, Qwen3: true}},
	{"qwen3-14b", "Qwen3-14B: 40 layers, hidden 5120, FFN 17408, GQA 40/8 (heads of 128) with q/k norms, vocab 151936",
		Llama{Layers: 40, Hidden: 5120, FFN: 17408, Heads: 40, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6, Qwen3: true}},
	{"qwen3-32b", "Qwen3-32B: 64 layers, hidden 5120, FFN 25600, GQA 64/8 (heads of 128) with q/k norms, vocab 151936",
		Llama{Layers: 64, Hidden: 5120, FFN: 25600, Heads: 64, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6, Qwen3: true}},
	{"llama3.2-3b", "Llama-3.2-3B: 28 layers, hidden 3072, FFN 8192, GQA 24/8 (heads of 128), vocab 128256",
		Llama{Layers: 28, Hidden: 3072, FFN: 8192, Heads: 24, KVHeads: 8, Vocab: 128256}},
	{"mistral-7b", "a Mistral-7B-v0.3-like shape: 32 layers, hidden 4096, FFN 14336, GQA 32/8, vocab 32768",
		Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 32768, Theta: 1e6}},
	{"llama3.1-70b-20l", "20 of Llama-3.1-70B's 80 layers: hidden 8192, FFN 28672, GQA 64/8, vocab 128256",
		Llama{Layers: 20, Hidden: 8192, FFN: 28672, Heads: 64, KVHeads: 8, Vocab: 128256}},
	{"llama3.1-70b", "Llama-3.1-70B: 80 layers, hidden 8192, FFN 28672, GQA 64/8, vocab 128256 (about 42 GB in NVFP4)",
		Llama{Layers: 80, Hidden: 8192, FFN: 28672, Heads: 64, KVHeads: 8, Vocab: 128256}},
}

func init() {
	for _, d := range denseShapes {
		l := d.l
		l.DType, l.Seed = weights.BF16, 1
		if _, dup := shapes[d.name]; dup {
			panic(fmt.Sprintf("testmodel: shape %q twice", d.name))
		}
		q := l
		q.NVFP4 = true
		shapes[d.name] = Spec{Description: d.what + "; NVFP4 linears, bf16 embeddings and LM head", Model: q}
		shapes[d.name+"-bf16"] = Spec{Description: d.what + "; every linear in bf16", Model: l}
	}
	// The bf16 twins of the NVFP4 shapes declared in shapes.go.
	for _, name := range []string{"qwen3-8b", "llama3-8b", "llama3.2-1b"} {
		l := shapes[name].Model.(Llama)
		l.NVFP4 = false
		shapes[name+"-bf16"] = Spec{Description: name + " with every linear in bf16", Model: l}
	}
}
