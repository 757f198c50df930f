#!/usr/bin/env python3
"""Golden fixtures and real-shape checks for issue 58's released MoE layouts:
DeepSeek-V3 (model_type deepseek_v3; R1 and V3.1 share it) with FP8 E4M3
linears and a float32 weight_scale_inv per 128x128 block, and Qwen3-MoE
(qwen3_moe) in bf16, each with one module per routed expert as the released
checkpoints name them (mlp.experts.N.gate_proj.weight, ...).

Fixture mode (default) writes, under --out (default $OUT), in the layout of
../shared/golden/README.md:

  deepseek_v3/            float32 checkpoint: the FP8 weights dequantized
                          (e4m3 * weight_scale_inv, exact in float32) and the
                          other tensors rounded to bf16, so it computes what
                          the fp8/ folder computes; golden.safetensors with
                          input_ids, logits_full, logits_incremental,
                          greedy_tokens.
  deepseek_v3/fp8/        the released layout: F8_E4M3 weights, F32
                          weight_scale_inv [ceil(out/128), ceil(in/128)],
                          bf16 embeddings, norms and router, F32
                          e_score_correction_bias, config.json with
                          quantization_config {quant_method: fp8, fmt: e4m3,
                          weight_block_size: [128, 128], activation_scheme:
                          dynamic}; golden.safetensors from transformers' own
                          FP8 loader dequantizing to float32 (when it does not
                          give exactly the float32 weights, the float32
                          folder's logits, and summary.json says why).
  qwen3_moe/              float32 checkpoint and full golden.
  qwen3_moe/bf16/         the released bf16 layout; golden from from_pretrained
                          of that folder, computed in float32.
  summary.json            T, P, parameter counts, max |logit|, which loader
                          made each reference, and the FP8-vs-float32 check.

Every reference is transformers' float32 forward pass (eager attention and
experts, no TF32) of the folder loaded by from_pretrained; the loaded
parameters are checked against the written ones (no missing or unexpected
key, equal values), so a naming mistake cannot pass silently.

Real-shape mode (--real-shape) writes, under --out, deepseek_v3_real/ (two
layers of DeepSeek-V3 at the released dimensions: hidden 7168, 128 heads,
a dense layer then a MoE layer of 256 experts, vocab 129280; FP8) and
qwen3_moe_real/ (two layers of Qwen3-30B-A3B, bf16), each with
golden.safetensors holding input_ids and logits_full (T=16). They are large
(about 16 GB and 1.5 GB): write them to local disk, not $OUT, then run
model.TestRealShape on them (see model/realshape_test.go).

Usage (device machine, transformers 5.17, no network):
  python3 model/testdata/gen_moe_fixtures.py --out "$OUT"
  python3 model/testdata/gen_moe_fixtures.py --real-shape --out /tmp/realshape [--arch qwen3_moe] [--no-fp8-loader]
(the real shape's weights are drawn and quantized on the GPU where there is
one, --gen-device; --no-fp8-loader builds transformers' model on the GPU
from the dequantized tensors at once instead of through its FP8 loader,
which dequantizes 11 GB of FP8 on the CPU: dev/realshape/run.sh passes it)
"""

import argparse
import json
import math
import os
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

BLOCK = 128  # DeepSeek-V3's weight_block_size
FP8_MAX = 448.0
GREEDY_PROMPT, GREEDY_NEW = 20, 24  # the fixtures' README

# The sizes of each architecture: the tiny fixture's and the released
# model's (two layers of it), field by field.
SIZES = {
    "deepseek_v3": (
        "vocab_size hidden_size intermediate_size moe_intermediate_size num_attention_heads n_routed_experts "
        "kv_lora_rank q_lora_rank qk_rope_head_dim v_head_dim qk_nope_head_dim n_group topk_group "
        "num_experts_per_tok num_hidden_layers first_k_dense_replace max_position_embeddings",
        (384, 160, 192, 48, 4, 8, 48, 64, 16, 32, 32, 4, 2, 2, 3, 1, 4096),
        (129280, 7168, 18432, 2048, 128, 256, 512, 1536, 64, 128, 128, 8, 4, 8, 2, 1, 163840)),
    "qwen3_moe": (
        "vocab_size hidden_size intermediate_size moe_intermediate_size num_attention_heads num_experts "
        "num_key_value_heads head_dim num_experts_per_tok num_hidden_layers max_position_embeddings",
        (384, 128, 192, 48, 4, 8, 2, 32, 2, 3, 4096),
        (151936, 2048, 6144, 768, 32, 128, 4, 128, 8, 2, 40960)),
}

# The other fields, as the released config.json has them (DeepSeek-V3's
# yarn original length 4096 and factor 40; the tiny one 512 and 8, so that
# a short fixture reaches the scaled frequencies).
FIXED = {
    "deepseek_v3": dict(n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True),
    "qwen3_moe": dict(norm_topk_prob=True, decoder_sparse_step=1, use_sliding_window=False),
}


def config_kwargs(arch, real):
    names, tiny, full = SIZES[arch]
    kw = dict(zip(names.split(), full if real else tiny), **FIXED[arch])
    kw.update(hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False)
    if arch == "deepseek_v3":
        kw["num_key_value_heads"] = kw["num_attention_heads"]
        kw["rope_parameters"] = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0 if real else 8.0,
                                     original_max_position_embeddings=4096 if real else 512, beta_fast=32,
                                     beta_slow=1, mscale=1.0, mscale_all_dim=1.0)
        kw.update(bos_token_id=0, eos_token_id=1)
    else:
        # The tiny model keeps its last layer dense (mlp_only_layers), as
        # none of Qwen3-30B-A3B's is.
        kw["mlp_only_layers"] = [] if real else [kw["num_hidden_layers"] - 1]
        kw["rope_parameters"] = dict(rope_type="default", rope_theta=1e6)
        kw.update(bos_token_id=151643 if real else 0, eos_token_id=151645 if real else 1)
    return kw


FP8_LINEAR = re.compile(r"^model\.layers\.\d+\..*\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|"
                        r"gate_proj|up_proj|down_proj)\.weight$")


def make_config(arch, kw):
    kw = dict(kw)
    try:
        return AutoConfig.for_model(arch, **kw)
    except TypeError:
        # A transformers without rope_parameters: the older rope_scaling form.
        rp = kw.pop("rope_parameters")
        kw["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type") != "default":
            kw["rope_scaling"] = rp
        return AutoConfig.for_model(arch, **kw)


def released(sd, cfg):
    """The released checkpoint's tensors from a state dict: fused experts
    (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], or their
    transposes) split into one module per expert. Works on meta tensors."""
    I = cfg.moe_intermediate_size
    H = cfg.hidden_size
    out = {}
    for name, t in sd.items():
        m = re.match(r"^(.*\.experts)\.(gate_up_proj|down_proj)$", name)
        if not m:
            out[name] = t
            continue
        base, kind = m.groups()
        E = t.shape[0]
        if kind == "gate_up_proj":
            if tuple(t.shape[1:]) == (H, 2 * I):
                t = t.transpose(1, 2)
            assert tuple(t.shape) == (E, 2 * I, H), (name, t.shape)
            for e in range(E):
                out[f"{base}.{e}.gate_proj.weight"] = t[e, :I]
                out[f"{base}.{e}.up_proj.weight"] = t[e, I:]
        else:
            if tuple(t.shape[1:]) == (I, H):
                t = t.transpose(1, 2)
            assert tuple(t.shape) == (E, H, I), (name, t.shape)
            for e in range(E):
                out[f"{base}.{e}.down_proj.weight"] = t[e]
    return out


def random_tensor(name, shape, gen):
    """Non-trivial values: norm weights near 1, the router bias around 0,
    embeddings N(0, 1), linears N(0, 1/fan_in); drawn on gen's device."""
    r = torch.randn(shape, generator=gen, device=gen.device)
    if name.endswith("e_score_correction_bias"):
        return 0.05 * r
    if len(shape) == 1:
        return 1 + 0.1 * r
    if name.endswith("embed_tokens.weight"):
        return r
    return r / math.sqrt(shape[-1])


def quantize_fp8(w):
    """DeepSeek-V3's block quantization: per 128x128 tile, scale = amax/448,
    code = e4m3(w / scale); weight_scale_inv is the scale (dequant
    multiplies)."""
    out, inn = w.shape
    so, si = -(-out // BLOCK), -(-inn // BLOCK)
    pad = torch.zeros(so * BLOCK, si * BLOCK, dtype=torch.float32, device=w.device)
    pad[:out, :inn] = w
    tiles = pad.view(so, BLOCK, si, BLOCK)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(so * BLOCK, si * BLOCK)[:out, :inn].contiguous()
    return q, scale.float().contiguous()


def dequantize_fp8(q, s):
    out, inn = q.shape
    full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out, :inn]
    return q.to(torch.float32) * full


def generate(arch, cfg, seed, device="cpu"):
    """The released tensors of a random model, in the released dtypes:
    deepseek_v3's FP8 linears as F8_E4M3 codes with F32 weight_scale_inv,
    its router bias F32, everything else bf16; drawn and quantized on
    device (the real shape's 16 GB: the GPU), kept on the CPU."""
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg)
    shapes = {n: tuple(t.shape) for n, t in released(meta.state_dict(), cfg).items()}
    del meta
    gen = torch.Generator(device).manual_seed(seed)
    rel = {}
    for name in sorted(shapes):
        v = random_tensor(name, shapes[name], gen)
        if arch == "deepseek_v3" and FP8_LINEAR.match(name):
            q, sc = quantize_fp8(v)
            rel[name], rel[name + "_scale_inv"] = q.cpu(), sc.cpu()
        elif name.endswith("e_score_correction_bias"):
            rel[name] = v.contiguous().cpu()
        else:
            rel[name] = v.to(torch.bfloat16).contiguous().cpu()
    return rel


def as_f32(rel, name, device=None):
    """The float32 value the released tensor name stands for: e4m3 *
    weight_scale_inv for an FP8 weight, the exact upcast otherwise;
    computed on device (default: where the tensor is)."""
    t = rel[name].to(device) if device is not None else rel[name]
    if t.dtype == torch.float8_e4m3fn:
        return dequantize_fp8(t, rel[name + "_scale_inv"].to(t.device))
    return t.float()


def f32_names(rel):
    return sorted(n for n in rel if not n.endswith("_scale_inv"))


def write_folder(d, cfg, tensors, dtype_name, quant=None, max_shard=4 << 30):
    os.makedirs(d, exist_ok=True)
    cfg.save_pretrained(d)
    path = os.path.join(d, "config.json")
    with open(path) as f:
        c = json.load(f)
    c["dtype"] = dtype_name
    c.pop("torch_dtype", None)
    if quant is not None:
        c["quantization_config"] = quant
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}, f, indent=2)
    names = sorted(tensors)
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    if total <= max_shard:
        save_file({n: tensors[n] for n in names}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    shards, cur, size = [], {}, 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and size + b > max_shard:
            shards.append(cur)
            cur, size = {}, 0
        cur[n] = tensors[n]
        size += b
    shards.append(cur)
    index = {"metadata": {"total_size": total}, "weight_map": {}}
    for i, s in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(s, os.path.join(d, fn), metadata={"format": "pt"})
        for n in s:
            index["weight_map"][n] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def load(d, device, **kw):
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True, **kw)
    try:
        model.set_experts_implementation("eager")
    except Exception as e:  # an API without it: keep what is there
        print("set_experts_implementation:", repr(e), file=sys.stderr)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    return model.to(device).eval(), bad


def check_params(model, cfg, rel):
    """max |param - written| over the released tensors (as float32), and
    the names that differ in dtype, shape or presence."""
    got = released({n: t.detach() for n, t in model.state_dict().items()}, cfg)
    names = f32_names(rel)
    problems = sorted(set(got) ^ set(names))
    worst = 0.0
    for n in set(got) & set(names):
        g, w = got[n], as_f32(rel, n, got[n].device)
        if g.dtype != torch.float32 or tuple(g.shape) != tuple(w.shape):
            problems.append(f"{n}: {g.dtype} {tuple(g.shape)}")
            continue
        worst = max(worst, (g - w.to(g.device)).abs().max().item())
    return worst, problems


def reference(model, ids, P, device, greedy=True):
    def run(x, past=None):
        with torch.no_grad():
            o = model(input_ids=x[None].to(device), past_key_values=past, use_cache=True)
        return o.logits[0].float().cpu(), o.past_key_values

    out = {"input_ids": ids.clone()}
    with torch.no_grad():
        out["logits_full"] = model(input_ids=ids[None].to(device), use_cache=False).logits[0].float().cpu()
    if not greedy:
        return out
    logits, past = run(ids[:P])
    rows = [logits[-1]]
    for p in range(P, len(ids)):
        logits, past = run(ids[p:p + 1], past)
        rows.append(logits[-1])
    out["logits_incremental"] = torch.stack(rows)
    logits, past = run(ids[:GREEDY_PROMPT])
    toks = []
    while True:
        t = int(logits[-1].argmax())
        toks.append(t)
        if len(toks) == GREEDY_NEW:
            break
        logits, past = run(torch.tensor([t]), past)
    out["greedy_tokens"] = torch.tensor(toks, dtype=torch.int64)
    return out


def save_golden(d, g):
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(d, "golden.safetensors"))


FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK], "activation_scheme": "dynamic"}


def fp8_loader_kwargs():
    from transformers import FineGrainedFP8Config
    return {"quantization_config": FineGrainedFP8Config(weight_block_size=(BLOCK, BLOCK), dequantize=True)}


def fixture(arch, a, cfg, root, summary):
    rel = generate(arch, cfg, a.seed)
    f32 = {n: as_f32(rel, n) for n in f32_names(rel)}
    T, P = a.tokens, a.prefill
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(a.seed + 1))
    d = os.path.join(root, arch)
    write_folder(d, cfg, f32, "float32")
    model, bad = load(d, a.device)
    diff, problems = check_params(model, cfg, rel)
    assert not bad and not problems and diff == 0, (arch, bad, problems[:10], diff)
    g = reference(model, ids, P, a.device)
    save_golden(d, g)
    del model
    s = {"T": T, "P": P, "params": sum(t.numel() for t in f32.values()),
         "max_abs_logit": g["logits_full"].abs().max().item(), "greedy": g["greedy_tokens"].tolist(),
         "incremental_vs_full_maxdiff": (g["logits_incremental"] - g["logits_full"][P - 1:]).abs().max().item()}
    sub, quant = ("fp8", FP8_QUANT) if arch == "deepseek_v3" else ("bf16", None)
    vd = os.path.join(d, sub)
    write_folder(vd, cfg, rel, "bfloat16", quant)
    s[sub] = v = {"loader": "from_pretrained(dtype=float32)"}
    try:
        kw = fp8_loader_kwargs() if quant else {}
        if quant:
            v["loader"] = "from_pretrained(dtype=float32, quantization_config=FineGrainedFP8Config(dequantize=True))"
        model, bad = load(vd, a.device, **kw)
        diff, problems = check_params(model, cfg, rel)
        v.update(loading_problems=bad, param_problems=problems[:10], param_maxdiff=diff)
        if bad or problems or diff != 0:
            raise RuntimeError(f"loaded parameters differ from the written ones: {bad} {problems[:5]} max {diff}")
        gv = reference(model, ids, P, a.device)
        v["vs_float32_folder_maxdiff"] = (gv["logits_full"] - g["logits_full"]).abs().max().item()
        v["greedy_equal_float32_folder"] = gv["greedy_tokens"].tolist() == g["greedy_tokens"].tolist()
    except Exception as e:  # noqa: BLE001: recorded; the float32 folder computes the same function
        if not quant:
            raise
        v["loader"] = f"FAILED ({type(e).__name__}: {e}); golden is the float32 folder's (the same function)"
        print(f"{vd}: transformers' FP8 loader: {e}", file=sys.stderr)
        gv = g
    save_golden(vd, gv)
    summary[arch] = s


def real_shape(arch, a, cfg, root):
    t0 = time.time()
    rel = generate(arch, cfg, a.seed, a.gen_device)
    print(f"{arch}: {sum(t.numel() * t.element_size() for t in rel.values()) / 1e9:.2f} GB drawn on {a.gen_device} "
          f"in {time.time() - t0:.0f}s", flush=True)
    d = os.path.join(root, arch + "_real")
    write_folder(d, cfg, rel, "bfloat16", FP8_QUANT if arch == "deepseek_v3" else None)
    print(f"{arch}: written to {d} at {time.time() - t0:.0f}s", flush=True)
    ids = torch.randint(0, cfg.vocab_size, (a.tokens,), generator=torch.Generator().manual_seed(a.seed + 1))
    loader, model = "from_pretrained(dtype=float32)", None
    try:
        if arch == "deepseek_v3" and a.no_fp8_loader:
            raise RuntimeError("--no-fp8-loader")
        kw = fp8_loader_kwargs() if arch == "deepseek_v3" else {}
        model, bad = load(d, a.device, **kw)
        diff, problems = check_params(model, cfg, rel)
        if bad or problems or diff != 0:
            raise RuntimeError(f"loaded parameters differ: {bad} {problems[:5]} max {diff}")
        if kw:
            loader += " with FineGrainedFP8Config(dequantize=True)"
    except Exception as e:  # noqa: BLE001
        if arch != "deepseek_v3":
            raise
        print(f"{d}: transformers' FP8 loader: {e}; using the float32 dequantization", file=sys.stderr)
        model = None
    if model is None:
        # transformers' model in float32, its parameters (fused experts
        # included) filled from the written tensors, built on the device
        # (two layers of DeepSeek-V3 are about 56 GB of float32).
        with torch.device(a.device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        try:
            model.set_experts_implementation("eager")
        except Exception:  # noqa: BLE001
            pass
        with torch.no_grad():
            for n, t in released(model.state_dict(), cfg).items():
                t.copy_(as_f32(rel, n, t.device))
        model = model.to(a.device).eval()
        diff, problems = check_params(model, cfg, rel)
        assert not problems and diff == 0, (problems[:5], diff)
        loader = "from_config, parameters set to the written tensors' float32 dequantization"
    del rel
    g = reference(model, ids, 0, a.device, greedy=False)
    save_golden(d, g)
    info = {"T": a.tokens, "loader": loader, "device": a.device, "gen_device": a.gen_device,
            "max_abs_logit": g["logits_full"].abs().max().item(), "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(arch, json.dumps(info))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--arch", choices=sorted(SIZES), action="append", help="default: both")
    p.add_argument("--seed", type=int, default=58)
    p.add_argument("--tokens", type=int, default=None, help="T (default 40, real shape 16)")
    p.add_argument("--prefill", type=int, default=17, help="P of logits_incremental")
    p.add_argument("--real-shape", action="store_true")
    p.add_argument("--device", default=None, help="default cpu (fixtures), cuda when present (real shape)")
    p.add_argument("--gen-device", default=None,
                   help="where the random weights are drawn and quantized (default: cpu for fixtures, --device for the real shape)")
    p.add_argument("--no-fp8-loader", action="store_true",
                   help="real shape: skip transformers' FP8 loader, use the float32 dequantization at once")
    a = p.parse_args()
    a.tokens = a.tokens or (16 if a.real_shape else 40)
    a.device = a.device or ("cuda" if a.real_shape and torch.cuda.is_available() else "cpu")
    a.gen_device = a.gen_device or (a.device if a.real_shape else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    archs = a.arch or sorted(SIZES)
    summary = {}
    for arch in archs:
        cfg = make_config(arch, config_kwargs(arch, a.real_shape))
        if a.real_shape:
            real_shape(arch, a, cfg, a.out)
        else:
            fixture(arch, a, cfg, a.out, summary)
    if summary:
        with open(os.path.join(a.out, "summary_moe.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
