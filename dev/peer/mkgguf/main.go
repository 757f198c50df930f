// Command mkgguf writes a random Llama or Qwen3 checkpoint in GGUF (F16
// tensors, f32 norms) of a given shape, for llama.cpp's llama-bench: the
// peer model of the benchmarks (dev/peer/llamacpp-cpu.sh, llamacpp-gpu.sh).
//
//	go run ./dev/peer/mkgguf -o OUT.gguf [-arch llama|qwen3] [-layers 16 -hidden 2048 -ffn 8192 -heads 32 -kv-heads 8 -vocab 32000] [-head-dim N] [-theta B]
//
// llama.cpp's convert_hf_to_gguf.py needs transformers and a tokenizer to
// read a Hugging Face folder, and its gguf-py needs numpy; neither is
// needed here. The weights are random (normal, standard deviation 0.02),
// the vocabulary a dummy SentencePiece one: llama-bench feeds token ids,
// so only the shape matters for speed.
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/manifoldlm/manifold/quant"
)

// GGUF value and tensor types (ggml's gguf.h, ggml.h).
const (
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tString  = 8
	tArray   = 9
	ggmlF32  = 0
	ggmlF16  = 1
	align    = 32
)

type tensor struct {
	name       string
	rows, cols int // rows 1: a vector
	typ        uint32
}

func (t tensor) bytes() int {
	if t.typ == ggmlF16 {
		return 2 * t.rows * t.cols
	}
	return 4 * t.rows * t.cols
}

type writer struct {
	w   *bufio.Writer
	err error
}

func (w *writer) put(v any) {
	if w.err == nil {
		w.err = binary.Write(w.w, binary.LittleEndian, v)
	}
}

func (w *writer) str(s string) {
	w.put(uint64(len(s)))
	if w.err == nil {
		_, w.err = w.w.WriteString(s)
	}
}

func (w *writer) kv(key string, typ uint32, v any) {
	w.str(key)
	w.put(typ)
	if typ == tString {
		w.str(v.(string))
		return
	}
	w.put(v)
}

func main() {
	out := flag.String("o", "", "output GGUF file")
	layers := flag.Int("layers", 16, "layers")
	hidden := flag.Int("hidden", 2048, "hidden size")
	ffn := flag.Int("ffn", 8192, "FFN size")
	heads := flag.Int("heads", 32, "attention heads")
	kvHeads := flag.Int("kv-heads", 8, "KV heads")
	vocab := flag.Int("vocab", 32000, "vocabulary size")
	arch := flag.String("arch", "llama", "llama, or qwen3 (q and k norms)")
	headDim := flag.Int("head-dim", 0, "head size (0: hidden / heads)")
	theta := flag.Float64("theta", 500000, "RoPE base")
	flag.Parse()
	if *headDim == 0 && *hidden%*heads == 0 {
		*headDim = *hidden / *heads
	}
	if *out == "" || *headDim <= 0 || (*arch != "llama" && *arch != "qwen3") {
		fmt.Fprintln(os.Stderr, "mkgguf: need -o, -arch llama or qwen3, and -head-dim or -hidden a multiple of -heads")
		os.Exit(2)
	}
	s := shape{arch: *arch, layers: *layers, hidden: *hidden, ffn: *ffn, heads: *heads, kvHeads: *kvHeads, vocab: *vocab, hd: *headDim, theta: *theta}
	if err := write(*out, s); err != nil {
		fmt.Fprintln(os.Stderr, "mkgguf:", err)
		os.Exit(1)
	}
}

// shape is the model mkgguf writes.
type shape struct {
	arch                                           string
	layers, hidden, ffn, heads, kvHeads, vocab, hd int
	theta                                          float64
}

func write(path string, s shape) error {
	layers, hidden, ffn, heads, kvHeads, vocab, hd := s.layers, s.hidden, s.ffn, s.heads, s.kvHeads, s.vocab, s.hd
	ts := []tensor{{"token_embd.weight", vocab, hidden, ggmlF16}}
	for l := range layers {
		p := fmt.Sprintf("blk.%d.", l)
		if s.arch == "qwen3" {
			ts = append(ts, tensor{p + "attn_q_norm.weight", 1, hd, ggmlF32}, tensor{p + "attn_k_norm.weight", 1, hd, ggmlF32})
		}
		ts = append(ts,
			tensor{p + "attn_norm.weight", 1, hidden, ggmlF32},
			tensor{p + "attn_q.weight", heads * hd, hidden, ggmlF16},
			tensor{p + "attn_k.weight", kvHeads * hd, hidden, ggmlF16},
			tensor{p + "attn_v.weight", kvHeads * hd, hidden, ggmlF16},
			tensor{p + "attn_output.weight", hidden, heads * hd, ggmlF16},
			tensor{p + "ffn_norm.weight", 1, hidden, ggmlF32},
			tensor{p + "ffn_gate.weight", ffn, hidden, ggmlF16},
			tensor{p + "ffn_up.weight", ffn, hidden, ggmlF16},
			tensor{p + "ffn_down.weight", hidden, ffn, ggmlF16})
	}
	ts = append(ts, tensor{"output_norm.weight", 1, hidden, ggmlF32}, tensor{"output.weight", vocab, hidden, ggmlF16})

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := &writer{w: bufio.NewWriterSize(f, 1<<20)}
	w.put([]byte("GGUF"))
	w.put(uint32(3))
	w.put(uint64(len(ts)))
	w.put(uint64(23)) // key-value pairs below
	a := s.arch
	w.kv("general.architecture", tString, a)
	w.kv("general.name", tString, "manifold-random")
	w.kv("general.file_type", tUint32, uint32(1)) // MOSTLY_F16
	w.kv(a+".context_length", tUint32, uint32(4096))
	w.kv(a+".embedding_length", tUint32, uint32(hidden))
	w.kv(a+".block_count", tUint32, uint32(layers))
	w.kv(a+".feed_forward_length", tUint32, uint32(ffn))
	w.kv(a+".attention.head_count", tUint32, uint32(heads))
	w.kv(a+".attention.head_count_kv", tUint32, uint32(kvHeads))
	w.kv(a+".attention.key_length", tUint32, uint32(hd))
	w.kv(a+".attention.value_length", tUint32, uint32(hd))
	w.kv(a+".rope.dimension_count", tUint32, uint32(hd))
	w.kv(a+".rope.freq_base", tFloat32, float32(s.theta))
	w.kv(a+".attention.layer_norm_rms_epsilon", tFloat32, float32(1e-5))
	w.kv(a+".vocab_size", tUint32, uint32(vocab))
	w.kv("tokenizer.ggml.model", tString, "llama")
	w.str("tokenizer.ggml.tokens")
	w.put(uint32(tArray))
	w.put(uint32(tString))
	w.put(uint64(vocab))
	for i := range vocab {
		switch i {
		case 0:
			w.str("<unk>")
		case 1:
			w.str("<s>")
		case 2:
			w.str("</s>")
		default:
			w.str(fmt.Sprintf("<t%d>", i))
		}
	}
	w.str("tokenizer.ggml.scores")
	w.put(uint32(tArray))
	w.put(uint32(tFloat32))
	w.put(uint64(vocab))
	w.put(make([]float32, vocab))
	w.str("tokenizer.ggml.token_type")
	w.put(uint32(tArray))
	w.put(uint32(tInt32))
	w.put(uint64(vocab))
	types := make([]int32, vocab)
	for i := range types {
		types[i] = 1 // normal
	}
	types[0], types[1], types[2] = 2, 3, 3 // unknown, control, control
	w.put(types)
	w.kv("tokenizer.ggml.bos_token_id", tUint32, uint32(1))
	w.kv("tokenizer.ggml.eos_token_id", tUint32, uint32(2))
	w.kv("tokenizer.ggml.padding_token_id", tUint32, uint32(0))
	w.kv("tokenizer.ggml.add_bos_token", 7, true) // bool

	off := 0
	for _, t := range ts {
		w.str(t.name)
		if t.rows == 1 {
			w.put(uint32(1))
			w.put(uint64(t.cols))
		} else {
			w.put(uint32(2))
			w.put([]uint64{uint64(t.cols), uint64(t.rows)})
		}
		w.put(t.typ)
		w.put(uint64(off))
		off += (t.bytes() + align - 1) / align * align
	}
	if w.err != nil {
		return w.err
	}
	pos, _ := f.Seek(0, 1)
	pos += int64(w.w.Buffered())
	w.put(make([]byte, (align-pos%align)%align))
	rng := rand.New(rand.NewPCG(1, 61))
	for _, t := range ts {
		n := t.rows * t.cols
		switch t.typ {
		case ggmlF32:
			v := make([]float32, n)
			for i := range v {
				v[i] = 1
			}
			w.put(v)
		case ggmlF16:
			v := make([]uint16, n)
			for i := range v {
				v[i] = quant.Float32ToF16(float32(rng.NormFloat64() * 0.02))
			}
			w.put(v)
		}
		w.put(make([]byte, (align-t.bytes()%align)%align))
	}
	if w.err != nil {
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
