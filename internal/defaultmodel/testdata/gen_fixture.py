#!/usr/bin/env python3
"""Regenerate fixture.safetensors: PyTorch's logits for the built-in model's
bf16 checkpoint, computed the way a user of that checkpoint meets it.

transformers' from_pretrained of the bf16/ folder keeps the rotary inv_freq
buffers in float32; the weights are then upcast to float32 and the forward
pass runs in float32 (no TF32), eager attention and experts. The sequences
(input_ids_k, prompt_ids) are read from the existing fixture, so only the
logits and the greedy continuation change. training/train.py wrote the first
version from a model cast with .to(torch.bfloat16), which also rounded
inv_freq to bf16 (issue 54).

Usage (device machine, transformers 5.17):
  python3 internal/defaultmodel/testdata/gen_fixture.py [--out DIR]
"""

import argparse
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(HERE, "bf16"))
    p.add_argument("--fixture", default=os.path.join(HERE, "fixture.safetensors"))
    p.add_argument("--out", default=os.environ.get("OUT", HERE))
    p.add_argument("--greedy", type=int, default=32)
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="eager")
    freqs = [(n, b) for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert freqs, "no rotary inv_freq buffer found"
    for n, b in freqs:
        assert b.dtype == torch.float32, f"{n} is {b.dtype}: transformers should keep it in float32"
    model = model.float().to(dev).eval()
    try:
        model.set_experts_implementation("eager")
    except Exception as e:  # older or newer API: keep what is there
        print("set_experts_implementation failed:", repr(e))

    def logits_of(ids):
        with torch.no_grad():
            return model(input_ids=ids.to(dev), use_cache=False).logits.float()

    old = load_file(a.fixture)
    fx = {}
    for k in range(100):
        name = f"input_ids_{k}"
        if name not in old:
            break
        ids = old[name]
        fx[name] = ids.clone()
        fx[f"logits_{k}"] = logits_of(ids[None])[0].cpu().contiguous()
        d = (fx[f"logits_{k}"] - old[f"logits_{k}"]).abs().max().item()
        print(f"sequence {k} ({len(ids)} tokens): max |new - old logits| {d:.3g}")
    prompt = old["prompt_ids"]
    seq = prompt.clone()
    for _ in range(a.greedy):
        nxt = logits_of(seq[None])[0, -1].argmax().item()
        seq = torch.cat([seq, torch.tensor([nxt], dtype=seq.dtype)])
    fx["prompt_ids"] = prompt.clone()
    fx["greedy_ids"] = seq[len(prompt):].clone()
    same = (fx["greedy_ids"] == old["greedy_ids"]).sum().item()
    print(f"greedy: {same} of {len(fx['greedy_ids'])} tokens as before")
    os.makedirs(a.out, exist_ok=True)
    save_file(fx, os.path.join(a.out, "fixture.safetensors"))
    print("wrote", os.path.join(a.out, "fixture.safetensors"))


if __name__ == "__main__":
    main()
