#!/usr/bin/env python3
"""Write a random Llama checkpoint in GGUF (F16) of a given shape, for llama-bench.

llama.cpp's convert_hf_to_gguf.py needs transformers (and a tokenizer) to read
a Hugging Face folder; neither is installable here, so this writes the GGUF
directly with llama.cpp's own gguf-py (numpy only). The weights are random
(normal, std 0.02), the vocabulary a dummy SentencePiece one: llama-bench
feeds token ids, so only the shape matters for speed.

usage: mkgguf.py GGUF_PY_DIR OUT.gguf [--layers 16 --hidden 2048 --ffn 8192
                 --heads 32 --kv-heads 8 --vocab 32000]
"""
import argparse
import sys

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("gguf_py")
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--ffn", type=int, default=8192)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=8)
ap.add_argument("--vocab", type=int, default=32000)
a = ap.parse_args()
sys.path.insert(0, a.gguf_py)
import gguf  # noqa: E402

rng = np.random.default_rng(1)
hd = a.hidden // a.heads
w = gguf.GGUFWriter(a.out, "llama")
w.add_name("manifold-random")
w.add_context_length(4096)
w.add_embedding_length(a.hidden)
w.add_block_count(a.layers)
w.add_feed_forward_length(a.ffn)
w.add_head_count(a.heads)
w.add_head_count_kv(a.kv_heads)
w.add_rope_dimension_count(hd)
w.add_rope_freq_base(500000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_vocab_size(a.vocab)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_tokenizer_model("llama")
w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"<t{i}>".encode() for i in range(3, a.vocab)])
w.add_token_scores([0.0] * a.vocab)
w.add_token_types([2, 3, 3] + [1] * (a.vocab - 3))
w.add_bos_token_id(1)
w.add_eos_token_id(2)


def t(name, rows, cols):
    w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16))


def norm(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))


t("token_embd.weight", a.vocab, a.hidden)
for l in range(a.layers):
    p = f"blk.{l}."
    norm(p + "attn_norm.weight", a.hidden)
    t(p + "attn_q.weight", a.heads * hd, a.hidden)
    t(p + "attn_k.weight", a.kv_heads * hd, a.hidden)
    t(p + "attn_v.weight", a.kv_heads * hd, a.hidden)
    t(p + "attn_output.weight", a.hidden, a.heads * hd)
    norm(p + "ffn_norm.weight", a.hidden)
    t(p + "ffn_gate.weight", a.ffn, a.hidden)
    t(p + "ffn_up.weight", a.ffn, a.hidden)
    t(p + "ffn_down.weight", a.hidden, a.ffn)
norm("output_norm.weight", a.hidden)
t("output.weight", a.vocab, a.hidden)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
