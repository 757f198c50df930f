#!/usr/bin/env python3
"""Train Manifold's default model: a small DeepSeek-V4 that writes Go.

Runs on one GPU in a single command, within a fixed wall-clock budget:

  1. reads train.txt.gz / val.txt.gz written by `go run ./training/prepare`
     (the Go standard library's sources, each file preceded by <|endoftext|>);
  2. trains a byte-level BPE tokenizer (GPT-2 pre-tokenizer and decoder, one
     special token <|endoftext|>, which is also BOS, EOS and the separator);
  3. trains DeepseekV4ForCausalLM (transformers 5.17) from DeepseekV4Config
     below: mHC residuals, CSA + HCA + sliding attention, hash-routed and
     top-k routed MoE with a shared expert. bf16 autocast, AdamW, cosine
     learning rate over the time budget, fixed seed; the loss goes to loss.csv;
  4. saves the model in bf16 (save_pretrained) with generation_config.json,
     tokenizer.json and tokenizer_config.json, tars it into --out in parts of
     at most 15 MB (model.tar.NN);
  5. computes, in float32 from the bf16-rounded weights (what the Go engine
     computes), the logits of a few validation sequences and a greedy
     continuation (fixture.safetensors), and the validation bits per byte:
     total nats over every predicted token / total UTF-8 bytes of those
     tokens / ln 2, on non-overlapping windows of --seq tokens of the
     validation stream (the first token of each window is context only);
  6. writes results.json.

Every phase after training is guarded, so a failure late in the run still
returns the model. Outputs are written as soon as they exist.

Usage (device): python3 training/train.py --data .train --out "$OUT" --budget 495
"""

import argparse
import copy
import gzip
import io
import json
import math
import os
import sys
import tarfile
import time
import traceback

T0 = time.time()
EOT = "<|endoftext|>"


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=".train")
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--work", default="/tmp/manifold-train")
    p.add_argument("--budget", type=float, default=495.0, help="wall seconds for the whole script")
    p.add_argument("--post-reserve", type=float, default=85.0, help="seconds kept for saving and evaluation")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--tok-sample-bytes", type=int, default=24_000_000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup-frac", type=float, default=0.04)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--bias-update", type=float, default=1e-3, help="aux-loss-free router bias step")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--val-every-s", type=float, default=40.0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--moe-inter", type=int, default=192)
    p.add_argument("--experts", type=int, default=4)
    return p.parse_args()


# ---------------------------------------------------------------- tokenizer


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_tokenizer(docs, vocab_size, sample_bytes):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    total = sum(map(len, docs))
    stride = max(1, math.ceil(total / sample_bytes))
    sample = docs[::stride]  # deterministic: every stride-th file in path order
    n = sum(map(len, sample))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    eot = tok.token_to_id(EOT)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B", special_tokens=[(EOT, eot)]
    )
    return tok, n


def token_byte_lengths(tok):
    inv = {c: b for b, c in bytes_to_unicode().items()}
    vocab = tok.get_vocab()
    lens = [0] * (max(vocab.values()) + 1)
    for s, i in vocab.items():
        if s == EOT:
            continue
        lens[i] = sum(1 for ch in s if ch in inv)
    return lens


def encode_stream(tok, docs, eot):
    encs = tok.encode_batch(docs, add_special_tokens=False)
    out = []
    for e in encs:
        out.append(eot)
        out.extend(e.ids)
    return out


# ---------------------------------------------------------------- model


def model_config(a, vocab, eot):
    from transformers import DeepseekV4Config

    CSA, HCA, SW = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
    pattern = [HCA, CSA, SW, CSA, HCA, CSA, SW, CSA]
    return DeepseekV4Config(
        vocab_size=vocab,
        hidden_size=a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        partial_rotary_factor=0.25,
        q_lora_rank=128,
        o_groups=2,
        o_lora_rank=128,
        moe_intermediate_size=a.moe_inter,
        n_routed_experts=a.experts,
        num_experts_per_tok=2,
        n_shared_experts=1,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        swiglu_limit=10.0,
        layer_types=pattern[: a.layers],
        mlp_layer_types=["hash_moe"] + ["moe"] * (a.layers - 1),
        compress_rates={CSA: 4, HCA: 16},
        sliding_window=64,
        index_n_heads=8,
        index_head_dim=32,
        index_topk=32,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_parameters={
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "compress": {
                "rope_type": "yarn",
                "rope_theta": 160000.0,
                "partial_rotary_factor": 0.25,
                "factor": 16.0,
                "original_max_position_embeddings": 256,
                "beta_fast": 32,
                "beta_slow": 1,
                "attention_factor": 1.0,
            },
        },
        max_position_embeddings=4096,
        bos_token_id=eot,
        eos_token_id=eot,
        tie_word_embeddings=False,
        initializer_range=0.02,
        use_cache=True,
    )


def set_experts(model, name):
    try:
        model.set_experts_implementation(name)
        return True
    except Exception as e:  # older or newer API: keep what is there
        log(f"set_experts_implementation({name!r}) failed: {e!r}")
        return False


# ---------------------------------------------------------------- main


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    results = {"args": vars(a)}

    def save_results():
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)

    import torch
    import torch.nn.functional as F

    log("torch", torch.__version__, "cuda", torch.cuda.is_available(),
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    import transformers
    import tokenizers

    log("transformers", transformers.__version__, "tokenizers", tokenizers.__version__)
    results["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_float32_matmul_precision("high")  # training only; evaluation below sets "highest"

    # ---- data and tokenizer
    def read(name):
        with gzip.open(os.path.join(a.data, name + ".gz"), "rb") as f:
            text = f.read().decode("utf-8")
        docs = text.split(EOT)
        assert docs[0] == "", f"{name}: does not start with the separator"
        return docs[1:]

    train_docs, val_docs = read("train.txt"), read("val.txt")
    log(f"data: train {len(train_docs)} files {sum(map(len, train_docs)) / 1e6:.1f} MB chars, "
        f"val {len(val_docs)} files")
    tok, tok_bytes = train_tokenizer(train_docs, a.vocab, a.tok_sample_bytes)
    eot = tok.token_to_id(EOT)
    V = tok.get_vocab_size()
    log(f"tokenizer: {V} tokens trained on {tok_bytes / 1e6:.1f} MB, eot id {eot}")
    for d in val_docs[:20]:
        ids = tok.encode(d, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != d:
            log("WARNING: tokenizer round trip differs on a validation file")
            break
    model_dir = os.path.join(a.work, "model")
    os.makedirs(model_dir, exist_ok=True)
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": EOT, "eos_token": EOT, "pad_token": EOT, "unk_token": None,
            "add_bos_token": False, "add_eos_token": False,
            "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        }, f, indent=1)

    blen = token_byte_lengths(tok)
    train_ids = encode_stream(tok, train_docs, eot)
    val_ids = encode_stream(tok, val_docs, eot)
    val_bytes_total = sum(len(d.encode("utf-8")) for d in val_docs)
    val_bytes_tok = sum(blen[i] for i in val_ids)
    train_bytes = sum(len(d.encode("utf-8")) for d in train_docs)
    log(f"encoded: train {len(train_ids)} tokens ({train_bytes / len(train_ids):.3f} bytes/token), "
        f"val {len(val_ids)} tokens; val bytes {val_bytes_total} vs token bytes {val_bytes_tok}")
    results["data"] = {"train_tokens": len(train_ids), "val_tokens": len(val_ids), "train_bytes": train_bytes,
                       "val_bytes": val_bytes_total, "val_token_bytes": val_bytes_tok, "vocab": V,
                       "tokenizer_sample_bytes": tok_bytes}
    save_results()
    from safetensors.torch import save_file

    save_file({"val_ids": torch.tensor(val_ids, dtype=torch.int32)}, os.path.join(a.out, "val_ids.safetensors"))

    train_t = torch.tensor(train_ids, dtype=torch.int32, device=dev)
    val_t = torch.tensor(val_ids, dtype=torch.int64)
    blen_t = torch.tensor(blen, dtype=torch.float64)
    del train_docs

    # ---- model
    torch.manual_seed(a.seed)
    from transformers import DeepseekV4ForCausalLM

    cfg = model_config(a, V, eot)
    model = DeepseekV4ForCausalLM(cfg)
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    g = torch.Generator().manual_seed(a.seed + 1)
    routers = []
    for i, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            tbl = torch.argsort(torch.rand(V, E, generator=g), dim=1)[:, :K]
            with torch.no_grad():
                gate.tid2eid.copy_(tbl)
        else:
            routers.append(gate)
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            # The indexer's top-k selection passes no gradient: its weights stay as initialized.
            for p in comp.indexer.parameters():
                p.requires_grad_(False)
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_params - n_expert + n_expert * K // E
    log(f"model: {n_params} parameters ({n_train} trained, {active} active per token), "
        f"bf16 {2 * n_params / 1e6:.1f} MB; layers {cfg.layer_types}")
    results["model"] = {"params": n_params, "trained_params": n_train, "active_params": active,
                        "config": cfg.to_dict()}
    save_results()

    counts = {id(r): torch.zeros(E, device=dev) for r in routers}

    def hook(mod, inp, out):
        with torch.no_grad():
            counts[id(mod)] += torch.bincount(out[2].reshape(-1), minlength=E).float()

    for r in routers:
        r.register_forward_hook(hook)

    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 2)
    T = a.seq
    ar = torch.arange(T + 1, device=dev)

    def batch(B):
        ix = torch.randint(0, len(train_ids) - T - 1, (B,), generator=gen).to(dev)
        w = train_t[ix[:, None] + ar[None, :]].long()
        return w[:, :-1], w[:, 1:]

    def fwd_loss(x, y):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    val_sub = [val_t[i * T:(i + 1) * T] for i in range(min(24, len(val_ids) // T))]

    def quick_val():
        model.eval()
        with torch.no_grad():
            x = torch.stack(val_sub).to(dev)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                logits = model(input_ids=x, use_cache=False).logits.float()
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1), reduction="sum").item()
            nb = blen_t[x[:, 1:].cpu()].sum().item()
        model.train()
        return nll / nb / math.log(2)

    # ---- pick the experts implementation and the batch by a short timing
    model.train()
    B = a.batch
    impl = None
    timings = {}
    for cand in ["grouped_mm", "eager"]:
        if not set_experts(model, cand):
            continue
        try:
            while True:
                try:
                    for _ in range(2):
                        x, y = batch(B)
                        fwd_loss(x, y).backward()
                    torch.cuda.synchronize()
                    t = time.time()
                    for _ in range(3):
                        x, y = batch(B)
                        fwd_loss(x, y).backward()
                    torch.cuda.synchronize()
                    timings[cand] = (time.time() - t) / 3
                    break
                except torch.OutOfMemoryError:
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    if B <= 8:
                        raise
                    B //= 2
                    log(f"out of memory: batch {B}")
            log(f"experts {cand}: {timings[cand] * 1000:.0f} ms/step at batch {B}x{T}, "
                f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        except Exception as e:
            log(f"experts {cand} failed: {e!r}")
        opt.zero_grad(set_to_none=True)
    for c in counts.values():
        c.zero_()
    if not timings:
        raise RuntimeError("no experts implementation ran")
    impl = min(timings, key=timings.get)
    set_experts(model, impl)
    results["train"] = {"experts_implementation": impl, "timings_ms": {k: v * 1000 for k, v in timings.items()},
                        "batch": B, "seq": T}
    log(f"using experts {impl}, batch {B}")

    # ---- train
    train_start = time.time()
    train_end = T0 + a.budget - a.post_reserve
    dur = train_end - train_start
    log(f"training for {dur:.0f} s")
    csv = open(os.path.join(a.out, "loss.csv"), "w")
    csv.write("step,seconds,tokens,lr,train_loss,train_bpb,val_bpb_subset\n")
    bytes_per_tok = train_bytes / len(train_ids)
    step, tokens, nacc = 0, 0, 0
    acc = torch.zeros((), device=dev)
    last_val = time.time()
    loss_v = float("nan")
    try:
        while True:
            now = time.time()
            if now >= train_end:
                break
            prog = (now - train_start) / dur
            if prog < a.warmup_frac:
                lr = a.lr * max(prog / a.warmup_frac, 0.02)
            else:
                q = (prog - a.warmup_frac) / (1 - a.warmup_frac)
                lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * q)))
            for gr in opt.param_groups:
                gr["lr"] = lr
            x, y = batch(B)
            loss = fwd_loss(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                for r in routers:
                    c = counts[id(r)]
                    r.e_score_correction_bias += a.bias_update * torch.sign(c.mean() - c)
                    c.zero_()
            step += 1
            tokens += B * T
            acc += loss.detach()
            nacc += 1
            if step % a.log_every == 0:
                loss_v = acc.item() / nacc
                acc.zero_()
                nacc = 0
                vb = ""
                if time.time() - last_val >= a.val_every_s:
                    vb = f"{quick_val():.4f}"
                    last_val = time.time()
                csv.write(f"{step},{time.time() - train_start:.1f},{tokens},{lr:.6g},{loss_v:.4f},"
                          f"{loss_v / bytes_per_tok / math.log(2):.4f},{vb}\n")
                csv.flush()
                log(f"step {step} loss {loss_v:.4f} ({loss_v / bytes_per_tok / math.log(2):.3f} bpb) lr {lr:.2e} "
                    f"tokens {tokens / 1e6:.1f}M" + (f" val_subset_bpb {vb}" if vb else ""))
                if not math.isfinite(loss_v):
                    raise RuntimeError("loss is not finite")
    except Exception:
        log("TRAINING STOPPED BY AN ERROR:\n" + traceback.format_exc())
        results["train_error"] = traceback.format_exc()
    try:
        vb = quick_val()
    except Exception:
        log("QUICK VAL FAILED:\n" + traceback.format_exc())
        vb = float("nan")
    csv.write(f"{step},{time.time() - train_start:.1f},{tokens},0,{loss_v:.4f},"
              f"{loss_v / bytes_per_tok / math.log(2):.4f},{vb:.4f}\n")
    csv.close()
    results["train"].update({"steps": step, "tokens": tokens, "seconds": time.time() - train_start,
                             "last_train_loss": loss_v, "val_bpb_subset_autocast": vb,
                             "router_bias": [r.e_score_correction_bias.tolist() for r in routers]})
    log(f"trained {step} steps, {tokens / 1e6:.1f}M tokens; val subset {vb:.4f} bpb (autocast)")
    save_results()

    # ---- save bf16
    del opt
    model.eval()
    model = model.to(torch.bfloat16)
    try:
        model.save_pretrained(model_dir, safe_serialization=True)
        with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": eot, "eos_token_id": eot, "do_sample": True, "temperature": 0.7,
                       "top_p": 0.95, "transformers_version": transformers.__version__}, f, indent=1)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name in sorted(os.listdir(model_dir)):
                tf.add(os.path.join(model_dir, name), arcname="model/" + name)
        data = buf.getvalue()
        part = 15 * 1000 * 1000
        for i in range(0, len(data), part):
            with open(os.path.join(a.out, f"model.tar.{i // part:02d}"), "wb") as f:
                f.write(data[i:i + part])
        log(f"saved {sorted(os.listdir(model_dir))}, tar {len(data) / 1e6:.1f} MB")
        results["saved_tar_bytes"] = len(data)
    except Exception:
        log("SAVE FAILED:\n" + traceback.format_exc())
        results["save_error"] = traceback.format_exc()
    save_results()

    # ---- float32 reference from the bf16-rounded weights
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ref = model.float()
    set_experts(ref, "eager")

    def logits_of(ids):
        with torch.no_grad():
            return ref(input_ids=ids.to(dev), use_cache=False).logits.float()

    try:
        fx = {}
        starts = [i for i, t in enumerate(val_ids) if t == eot]
        specs = [(starts[0], 144), (starts[len(starts) // 3] + 200, 80), (starts[2 * len(starts) // 3] + 37, 37)]
        for k, (s, n) in enumerate(specs):
            ids = val_t[s:s + n]
            fx[f"input_ids_{k}"] = ids.clone()
            fx[f"logits_{k}"] = logits_of(ids[None])[0].cpu().contiguous()
        prompt = torch.tensor(tok.encode("func main() {", add_special_tokens=True).ids, dtype=torch.int64)
        seq = prompt.clone()
        for _ in range(32):
            nxt = logits_of(seq[None])[0, -1].argmax().item()
            seq = torch.cat([seq, torch.tensor([nxt])])
        fx["prompt_ids"] = prompt
        fx["greedy_ids"] = seq[len(prompt):].clone()
        save_file(fx, os.path.join(a.out, "fixture.safetensors"))
        results["greedy_text"] = tok.decode(seq.tolist(), skip_special_tokens=False)
        log("fixture saved; greedy:", repr(results["greedy_text"]))
    except Exception:
        log("FIXTURE FAILED:\n" + traceback.format_exc())
        results["fixture_error"] = traceback.format_exc()
    save_results()

    # ---- validation bits per byte (float32, bf16-rounded weights)
    try:
        nw = (len(val_ids) - 1) // T + 1
        wins = [val_t[i * T:(i + 1) * T] for i in range(nw)]
        wins = [w for w in wins if len(w) >= 2]
        nats, nbytes, per_win = 0.0, 0.0, []
        for i in range(0, len(wins), 16):
            grp = wins[i:i + 16]
            full = [w for w in grp if len(w) == T]
            rest = [w for w in grp if len(w) != T]
            for chunk in ([torch.stack(full)] if full else []) + [w[None] for w in rest]:
                lg = logits_of(chunk)
                tgt = chunk[:, 1:].to(dev)
                nll = F.cross_entropy(lg[:, :-1].reshape(-1, V).double(), tgt.reshape(-1), reduction="none")
                nll = nll.view(tgt.shape).sum(1).cpu()
                nb = blen_t[chunk[:, 1:]].sum(1)
                for j in range(chunk.shape[0]):
                    per_win.append((nll[j].item(), nb[j].item()))
        nats = sum(p[0] for p in per_win)
        nbytes = sum(p[1] for p in per_win)
        sub = per_win[:64]
        results["val"] = {
            "windows": len(per_win), "seq": T, "nats": nats, "bytes": nbytes,
            "bpb": nats / nbytes / math.log(2),
            "bpb_first64": sum(p[0] for p in sub) / sum(p[1] for p in sub) / math.log(2),
        }
        log(f"VAL bf16 weights, f32 compute: {results['val']['bpb']:.4f} bpb over {len(per_win)} windows "
            f"({nbytes:.0f} bytes); first 64 windows {results['val']['bpb_first64']:.4f}")
    except Exception:
        log("VAL FAILED:\n" + traceback.format_exc())
        results["val_error"] = traceback.format_exc()
    save_results()

    # ---- the saved folder loads back to the same logits
    try:
        from transformers import DeepseekV4ForCausalLM as M

        back = M.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
        set_experts(back, "eager")
        ids = val_t[:96][None].to(dev)
        with torch.no_grad():
            d = (back(input_ids=ids, use_cache=False).logits.float() - logits_of(ids)).abs().max().item()
        results["reload_max_abs_diff"] = d
        log(f"from_pretrained round trip: max |logit diff| {d:.3g}")
    except Exception:
        log("RELOAD CHECK FAILED:\n" + traceback.format_exc())
        results["reload_error"] = traceback.format_exc()
    results["total_seconds"] = time.time() - T0
    save_results()
    log("done")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        log("FATAL:\n" + traceback.format_exc())
        sys.exit(1)
