#!/usr/bin/env python3
"""Write longrope.safetensors, the fixture of engine's TestLongRoPE.

The model is two layers of Qwen3-8B (hidden 4096, heads 32/8 of 128,
rope_theta 1e6) with seeded random bf16 weights and a 4096-token vocabulary,
written by the Go side so that the test can rebuild it from the seed:

  CGO_ENABLED=0 go build -o .device/write ./internal/testmodel/write   # here
  .device/write -shape qwen3-8b-2l-bf16 -out /tmp/longrope             # device
  python3 engine/testdata/gen_longrope.py --model /tmp/longrope        # device

transformers loads the folder as a user would (from_pretrained: the rotary
inv_freq stays float32), computes in float32 with eager attention, and runs
the sequence in chunks through its KV cache. The fixture keeps the token ids,
the positions and the logits at those positions (near 1,000 and 30,000):
about 0.4 MB. It also prints how far the logits move when inv_freq is
rounded to bf16, the error this test exists to catch.
"""

import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, DynamicCache

HERE = os.path.dirname(os.path.abspath(__file__))
POSITIONS = list(range(999, 1007)) + list(range(29999, 30007))


def run(model, ids, positions, chunk, dev):
    cache = DynamicCache(config=model.config)
    rows = {}
    with torch.no_grad():
        for lo in range(0, len(ids), chunk):
            part = ids[lo:lo + chunk]
            out = model(input_ids=part[None].to(dev), past_key_values=cache, use_cache=True)
            for p in positions:
                if lo <= p < lo + len(part):
                    rows[p] = out.logits[0, p - lo].float().cpu()
    return torch.stack([rows[p] for p in positions])


def exact_float32():
    """float32 matmuls without TF32; returns the device to run on."""
    for flags in (torch.backends.cuda.matmul, torch.backends.cudnn):
        flags.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return "cuda" if torch.cuda.is_available() else "cpu"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="folder written by internal/testmodel/write -shape qwen3-8b-2l-bf16")
    ap.add_argument("--out", default=os.environ.get("OUT", HERE))
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=54)
    a = ap.parse_args()

    dev = exact_float32()

    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager")
    freqs = [(n, b) for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert freqs, "no rotary inv_freq buffer"
    for n, b in freqs:
        assert b.dtype == torch.float32, f"{n} is {b.dtype}: transformers should keep it in float32"
    model = model.float().to(dev).eval()
    freqs = [(n, b) for n, b in model.named_buffers() if n.endswith("inv_freq")]  # the moved buffers

    n = POSITIONS[-1] + 1
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=g, dtype=torch.int64)
    logits = run(model, ids, POSITIONS, a.chunk, dev)

    # What the bug did: the same run with inv_freq rounded to bf16.
    for _, b in freqs:
        b.copy_(b.to(torch.bfloat16).float())
    rounded = run(model, ids, POSITIONS, a.chunk, dev)
    for lo, hi, what in ((0, 8, "near 1,000"), (8, 16, "near 30,000")):
        d = (rounded[lo:hi] - logits[lo:hi]).abs()
        agree = (rounded[lo:hi].argmax(-1) == logits[lo:hi].argmax(-1)).sum().item()
        print(f"bf16-rounded inv_freq {what}: max |dlogit| {d.max().item():.4g}, mean {d.mean().item():.4g}, "
              f"top token agrees at {agree} of {hi - lo}")

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "longrope.safetensors")
    save_file({"input_ids": ids.to(torch.int32), "positions": torch.tensor(POSITIONS, dtype=torch.int32),
               "logits": logits.contiguous()}, path)
    print("wrote", path, "max |logit|", logits.abs().max().item())


if __name__ == "__main__":
    main()
