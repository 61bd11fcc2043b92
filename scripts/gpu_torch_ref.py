#!/usr/bin/env python3
"""gpu_torch_ref.py -- the PyTorch side of the GPU proof (issue 14), run on the GPU machine.

  bench OUT.json            SDPA (flash) attention fwd/bwd and torch.matmul at backend_ops' perf shapes
  make  DIR MODEL SEQ       a randomly initialised LlamaForCausalLM (seed 0; MODEL small|1b, the configs in
                            scripts/gpu_models/) saved as a Hugging Face
                            folder (fp32 safetensors) + DIR/tokens.bin (llm.c format, 4 windows of SEQ+1)
  loss  DIR SEQ OUT.json    loss and global gradient norm of the first window (what ctxrun's step 1 sees)
                            in fp32 and with bf16 autocast
  train DIR SEQ STEPS OUT.json [compile]
                            tokens/s of the same model in PyTorch: bf16 weights, eager (or torch.compile)
                            + SDPA, AdamW

Conventions match bench/backend_ops.cpp: attention fwd FLOPs = 4 d hq pairs, bwd = 10 d hq pairs
(pairs = the causal (q, k) pairs), GEMM = 2 m n k. Times are medians over CUDA events after warm-up.
"""
import json
import math
import os
import struct
import sys
import time

import torch


def median_ms(fn, warm=3, reps=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def bench(out):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    rows = []
    dev = "cuda"
    torch.manual_seed(0)
    for (m, n, k, dt) in [(8192, 8192, 8192, torch.bfloat16), (8192, 8192, 8192, torch.float32),
                          (4096, 6144, 4096, torch.bfloat16), (4096, 4096, 4096, torch.bfloat16),
                          (4096, 28672, 4096, torch.bfloat16), (4096, 4096, 14336, torch.bfloat16),
                          (4096, 128256, 4096, torch.bfloat16)]:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        ms = median_ms(lambda: torch.matmul(a, b))
        rows.append({"op": "matmul", "m": m, "n": n, "k": k, "dtype": str(dt).split(".")[-1],
                     "ms": ms, "tflops": 2.0 * m * n * k / ms / 1e9})
        del a, b
    hq, d = 32, 128
    for (T, hkv) in [(8192, 8), (16384, 8), (32768, 8), (16384, 4), (32768, 4), (65536, 8), (131072, 8)]:
        q = torch.randn(1, hq, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, hkv, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, hkv, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(1, hq, T, d, device=dev, dtype=torch.bfloat16)
        pairs = T * (T + 1) / 2
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            def fwdbwd():
                o = fwd()
                o.backward(go)
            try:
                fms = median_ms(fwd)
                fbms = median_ms(fwdbwd, warm=2, reps=5)
                backend = "flash"
            except RuntimeError as e:  # flash refuses: say so, time nothing
                rows.append({"op": "sdpa", "T": T, "hq": hq, "hkv": hkv, "error": str(e)[:200]})
                continue
        bms = max(fbms - fms, 1e-9)
        rows.append({"op": "sdpa_" + backend, "T": T, "hq": hq, "hkv": hkv, "d": d, "causal": True,
                     "fwd_ms": fms, "bwd_ms": bms, "fwd_tflops": 4.0 * d * hq * pairs / fms / 1e9,
                     "bwd_tflops": 10.0 * d * hq * pairs / bms / 1e9})
        del q, k, v, go
        torch.cuda.empty_cache()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "rows": rows}
    json.dump(info, open(out, "w"), indent=1)
    for r in rows:
        print(json.dumps(r))


# The models live in scripts/gpu_models/ as Hugging Face config.json files, which ctxplan predicts from too.
MODELS = {"small": "small-d128.json", "1b": "llama-3.2-1b-shapes.json"}


def make(dirname, name, seq):
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(dirname, exist_ok=True)
    torch.manual_seed(0)
    cfg_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_models", MODELS[name])
    c = LlamaConfig.from_json_file(cfg_path)
    assert c.max_position_embeddings > seq, f"{cfg_path}: max_position_embeddings must exceed {seq}"
    m = LlamaForCausalLM(c).float()
    m.save_pretrained(dirname, safe_serialization=True)
    cj = json.load(open(os.path.join(dirname, "config.json")))
    cj["rope_theta"] = c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta
    json.dump(cj, open(os.path.join(dirname, "config.json"), "w"), indent=1)
    n = 4 * (seq + 1)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, min(c.vocab_size, 65535), (n,), generator=g, dtype=torch.int32)
    with open(os.path.join(dirname, "tokens.bin"), "wb") as f:
        hdr = [20240520, 1, n] + [0] * 253
        f.write(struct.pack("<256i", *hdr))
        f.write(toks.numpy().astype("<u2").tobytes())
    print(f"make: {name} ({sum(p.numel() for p in m.parameters()) / 1e6:.1f}M parameters) into {dirname}, {n} tokens")


def load(dirname, dtype):
    from transformers import LlamaForCausalLM
    m = LlamaForCausalLM.from_pretrained(dirname, dtype=dtype, attn_implementation="sdpa").cuda()
    return m


def first_window(dirname, seq):
    raw = open(os.path.join(dirname, "tokens.bin"), "rb").read()
    n = struct.unpack_from("<i", raw, 8)[0]
    import numpy as np
    toks = np.frombuffer(raw, dtype="<u2", count=n, offset=1024).astype("int64")
    w = torch.from_numpy(toks[: seq + 1].copy()).cuda()
    return w[:-1].unsqueeze(0), w[1:].unsqueeze(0)


def loss(dirname, seq, out):
    x, y = first_window(dirname, seq)
    res = {}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for tag, dtype, autocast in [("fp32", torch.float32, False), ("bf16_autocast", torch.float32, True)]:
        m = load(dirname, dtype)
        m.zero_grad()
        # fp32 SDPA falls back to the math backend, which keeps every layer's (heads, T, T) scores for the
        # backward: 137 GB at 8K tokens on the 1B shapes (seen on the H200, 2026-11-28). The memory-efficient
        # backend runs fp32 without them.
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = m(input_ids=x).logits.float()
            l = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
            l.backward()
        gn = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in m.parameters() if p.grad is not None))
        res[tag] = {"loss": float(l), "grad_norm": gn}
        del m, logits, l
        torch.cuda.empty_cache()
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


def train(dirname, seq, steps, out, compiled=False):
    m = load(dirname, torch.bfloat16)
    m.gradient_checkpointing_disable()
    if compiled:
        m = torch.compile(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    x, y = first_window(dirname, seq)
    def step():
        l = m(input_ids=x, labels=y).loss
        l.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    res = {"seq": seq, "step_s": dt, "tokens_per_s": seq / dt, "peak_bytes": torch.cuda.max_memory_allocated(),
           "params": sum(p.numel() for p in m.parameters()),
           "mode": ("torch.compile" if compiled else "eager") + "+sdpa, bf16 weights, fused AdamW"}
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a:
        print(__doc__)
        sys.exit(2)
    if a[0] == "bench":
        bench(a[1])
    elif a[0] == "make":
        make(a[1], a[2], int(a[3]))
    elif a[0] == "loss":
        loss(a[1], int(a[2]), a[3])
    elif a[0] == "train":
        train(a[1], int(a[2]), int(a[3]), a[4], compiled=len(a) > 5 and a[5] == "compile")
    else:
        print(__doc__)
        sys.exit(2)
