"""Record what the FlashMLA builds' operations take and allocate, on a GPU, as JSON.

Usage (on the GPU machine, after `source scripts/gpu-env.sh`, with vLLM's build in the folder
that $MLAMEM_VLLM_FLASHMLA names):

    python3 scripts/kernel_trace.py OUT.json

For each build (sgl-flash-mla's `flash_mla_legacy` ops, vLLM's `_flashmla_C` and
`_flashmla_extension_C`) and each operation (sparse decode, dense decode in bf16 and fp8,
sparse prefill) it records:
- the op schemas, as the libraries register them;
- which query head counts each operation runs (tried one by one at a small shape);
- the allocator trace of one call (`torch.cuda.memory._record_memory_history`): each
  allocation and free inside the call, in order, with its size, with and without `out_`;
- `triton.testing.do_bench` medians;
- cross-build equality of out and lse, and each build's largest error against an fp32 torch
  reference, so tolerances come from measured errors.
The adapters' allocation specs (`kernels/flashmla.py`, `kernels/flashmla_vllm.py`) cite it.
"""

# ruff: noqa: B023  (every lambda here runs inside its loop iteration)
from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch

DEVICE = torch.device("cuda")
D_QK, D_V, SCALE = 576, 512, (192 + 64) ** -0.5  # GLM-5's qk_nope + qk_rope
HEADS = (8, 16, 32, 64, 128)


def load_builds() -> dict:
    import flash_mla  # noqa: F401  registers torch.ops.flash_mla_legacy

    found = {"sgl": torch.ops.flash_mla_legacy}
    folder = Path(os.environ["MLAMEM_VLLM_FLASHMLA"])
    for name in ("_flashmla_C", "_flashmla_extension_C"):
        try:
            torch.ops.load_library(str(folder / f"{name}.abi3.so"))
            found[name] = getattr(torch.ops, name)
        except Exception as exc:  # record why, go on
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


def schemas(namespace) -> dict:
    out = {}
    for op in ("sparse_decode_fwd", "dense_decode_fwd", "sparse_prefill_fwd",
               "fwd_kvcache_mla_fp8", "get_mla_decoding_metadata_dense_fp8",
               "get_mla_decoding_metadata"):
        with contextlib.suppress(Exception):
            out[op] = str(getattr(namespace, op).default._schema)
    return out


def trace(fn):
    """Run fn once under the allocator history; return (result, events, peak bytes)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    result = fn()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [{"action": e["action"], "addr": e["addr"], "size": e["size"]}
              for e in snapshot["device_traces"][0]
              if e["action"] in ("alloc", "free_requested")]
    return result, events, torch.cuda.max_memory_allocated() - before


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def attempt(fn):
    try:
        fn()
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


# ---- inputs -------------------------------------------------------------------------------
def prefill_inputs(s_q, h_q, s_kv, topk, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    q = torch.randn((s_q, h_q, D_QK), dtype=torch.bfloat16, device=DEVICE, generator=g)
    kv = torch.randn((s_kv, 1, D_QK), dtype=torch.bfloat16, device=DEVICE, generator=g)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32, device=DEVICE,
                            generator=g)
    return q, kv, indices


def dense_inputs(b, h_q, context, block, dtype, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    blocks_per = -(-context // block)
    q = torch.randn((b, 1, h_q, D_QK), dtype=torch.bfloat16, device=DEVICE, generator=g)
    cache = torch.randn((b * blocks_per, block, 1, D_QK), dtype=torch.bfloat16, device=DEVICE,
                        generator=g)
    if dtype == "fp8":
        cache = cache.to(torch.float8_e4m3fn)
    table = torch.randperm(b * blocks_per, device=DEVICE, generator=g).to(torch.int32).view(
        b, blocks_per)
    seqlens = torch.full((b,), context, dtype=torch.int32, device=DEVICE)
    return q, cache, table, seqlens


# ---- references (fp32) ----------------------------------------------------------------------
def prefill_reference(q, kv, indices):
    k = kv[:, 0].float()  # (s_kv, 576)
    idx = indices[:, 0].long()  # (s_q, topk)
    valid = (idx >= 0) & (idx < k.shape[0])
    gathered = k[idx.clamp(0, k.shape[0] - 1)]  # (s_q, topk, 576)
    scores = torch.einsum("shd,skd->shk", q.float(), gathered) * SCALE
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # (s_q, h)
    out = torch.einsum("shk,skd->shd", torch.softmax(scores, -1), gathered[..., :D_V])
    return out, lse


def dense_reference(q, cache, table, seqlens, scale_q=1.0, scale_k=1.0):
    b, context = table.shape[0], int(seqlens[0])
    kv = cache.float()[table.long()].reshape(b, -1, D_QK)[:, :context] * scale_k  # (b, L, 576)
    scores = torch.einsum("bhd,bld->bhl", q[:, 0].float() * scale_q, kv) * SCALE
    lse = torch.logsumexp(scores, -1)
    out = torch.einsum("bhl,bld->bhd", torch.softmax(scores, -1), kv[..., :D_V])
    return out, lse


def errors(out, lse, ref_out, ref_lse) -> dict:
    return {"out_max_abs": (out.float() - ref_out).abs().max().item(),
            "out_rel_l2": ((out.float() - ref_out).norm() / ref_out.norm()).item(),
            "lse_max_abs": (lse.float() - ref_lse).abs().max().item()}


# ---- operations -----------------------------------------------------------------------------
def sparse_prefill(builds, record):
    sgl, vllm = builds["sgl"], builds["_flashmla_C"]
    calls = {
        "sgl": lambda q, kv, i, out=None: sgl.sparse_prefill_fwd(q, kv, i, SCALE, D_V, None,
                                                                 None, False, True),
        "vllm": lambda q, kv, i, out=None: vllm.sparse_prefill_fwd(q, kv, i, SCALE, D_V, None,
                                                                   None, out),
    }
    heads = record.setdefault("sparse_prefill_heads", {})
    for build, call in calls.items():
        for h in HEADS:
            q, kv, i = prefill_inputs(128, h, 4096, 2048)
            heads[f"{build} h={h}"] = attempt(lambda: call(q, kv, i))
    traces = record.setdefault("sparse_prefill_traces", [])
    for s_q in (1024, 8192):
        for h in (8, 64):
            q, kv, i = prefill_inputs(s_q, h, 8192, 2048)
            for build, call in calls.items():
                for with_out in ((False, True) if build == "vllm" else (False,)):
                    if heads[f"{build} h={h}"] != "ok":
                        continue
                    out = torch.empty((s_q, h, D_V), dtype=torch.bfloat16,
                                      device=DEVICE) if with_out else None
                    call(q, kv, i, out)  # warm-up: module loads
                    result, events, peak = trace(lambda: call(q, kv, i, out))
                    row = {"build": build, "s_q": s_q, "h_q": h, "s_kv": 8192, "topk": 2048,
                           "out_": with_out, "events": events, "peak": peak,
                           "returned": [None if t is None else [list(t.shape), str(t.dtype)]
                                        for t in result],
                           "ms": bench(lambda: call(q, kv, i, out))}
                    if s_q == 1024:
                        ref = prefill_reference(q, kv, i)
                        row["error"] = errors(result[0], result[2], *ref)
                        row["lse_log2_vs_ln"] = (result[2].float() / ref[1]).median().item()
                    traces.append(row)
                    del result
            if heads[f"sgl h={h}"] == "ok":
                a = calls["sgl"](q, kv, i)
                b = calls["vllm"](q, kv, i)
                record.setdefault("sparse_prefill_cross", []).append(
                    {"s_q": s_q, "h_q": h, "out_equal": torch.equal(a[0], b[0]),
                     "lse_equal": torch.equal(a[2], b[2]),
                     "out_max_diff": (a[0].float() - b[0].float()).abs().max().item()})


def dense_decode(builds, record):
    sgl, vllm, ext = builds["sgl"], builds["_flashmla_C"], builds["_flashmla_extension_C"]
    bf16 = {
        "sgl": lambda q, c, t, s, out=None: sgl.dense_decode_fwd(q, c, D_V, s, t, SCALE, False,
                                                                 None, None),
        "vllm": lambda q, c, t, s, out=None: vllm.dense_decode_fwd(q, c, D_V, s, t, SCALE,
                                                                   False, None, None, out),
    }
    heads = record.setdefault("dense_decode_heads", {})
    for build, call in bf16.items():
        for h in HEADS:
            q, c, t, s = dense_inputs(4, h, 1024, 64, "bf16")
            heads[f"{build} bf16 h={h}"] = attempt(lambda: call(q, c, t, s))
    traces = record.setdefault("dense_decode_traces", [])
    for b, context in ((64, 4096), (256, 8192)):
        q, c, t, s = dense_inputs(b, 64, context, 64, "bf16")
        for build, call in bf16.items():
            for with_out in ((False, True) if build == "vllm" else (False,)):
                out = torch.empty((b, 1, 64, D_V), dtype=torch.bfloat16,
                                  device=DEVICE) if with_out else None
                call(q, c, t, s, out)
                result, events, peak = trace(lambda: call(q, c, t, s, out))
                row = {"build": build, "kv": "bf16", "b": b, "context": context, "h_q": 64,
                       "out_": with_out, "events": events, "peak": peak,
                       "returned": [None if x is None else [list(x.shape), str(x.dtype)]
                                    for x in result],
                       "ms": bench(lambda: call(q, c, t, s, out))}
                if b == 64:
                    row["error"] = errors(result[0][:, 0], result[1][:, :, 0],
                                          *dense_reference(q, c, t, s))
                traces.append(row)
        a, bb = bf16["sgl"](q, c, t, s), bf16["vllm"](q, c, t, s)
        record.setdefault("dense_decode_cross", []).append(
            {"b": b, "context": context, "out_equal": torch.equal(a[0], bb[0]),
             "lse_equal": torch.equal(a[1], bb[1]),
             "out_max_diff": (a[0].float() - bb[0].float()).abs().max().item()})
    # fp8: who takes what
    fp8_ns = {"sgl": sgl}
    if not isinstance(ext, str):
        fp8_ns["vllm-ext"] = ext
    one = torch.ones((1,), dtype=torch.float32, device=DEVICE)
    fp8 = record.setdefault("dense_fp8", {})
    for build, ns in fp8_ns.items():
        for h in HEADS:
            q, c, t, s = dense_inputs(4, h, 1024, 64, "fp8")
            for q_kind in ("bf16", "fp8"):
                for descale in (False, True):
                    qq = q if q_kind == "bf16" else q.to(torch.float8_e4m3fn)

                    def run():
                        meta, splits = ns.get_mla_decoding_metadata_dense_fp8(s, h, 1)
                        return ns.fwd_kvcache_mla_fp8(qq, c, D_V, s, t, SCALE, False, meta,
                                                      splits, one if descale else None,
                                                      one if descale else None)
                    fp8[f"{build} h={h} q={q_kind} descale={descale}"] = attempt(run)
        for b, context in ((64, 4096), (256, 8192)):
            q, c, t, s = dense_inputs(b, 64, context, 64, "fp8")
            for q_kind in ("bf16", "fp8"):
                qq = q if q_kind == "bf16" else q.to(torch.float8_e4m3fn)
                key = f"{build} h=64 q={q_kind} descale=True"
                if fp8.get(key) != "ok":
                    continue
                meta_events = trace(lambda: ns.get_mla_decoding_metadata_dense_fp8(s, 64, 1))
                meta, splits = meta_events[0]

                def call(qq=qq, meta=meta, splits=splits):
                    return ns.fwd_kvcache_mla_fp8(qq, c, D_V, s, t, SCALE, False, meta, splits,
                                                  one, one)
                call()
                result, events, peak = trace(call)
                row = {"build": build, "kv": "fp8", "q": q_kind, "b": b, "context": context,
                       "h_q": 64, "metadata_events": meta_events[1],
                       "metadata": [list(meta.shape), list(splits.shape)],
                       "events": events, "peak": peak,
                       "returned": [[list(x.shape), str(x.dtype)] for x in result],
                       "ms": bench(call)}
                if b == 64:
                    row["error"] = errors(result[0][:, 0], result[1][:, :, 0],
                                          *dense_reference(qq, c, t, s))
                traces.append(row)


def sparse_decode_heads(builds, record):
    from mlamem.kernels.fp8_ds_mla import quantize

    vllm = builds["_flashmla_C"]
    heads = record.setdefault("sparse_decode_heads", {})
    latent = torch.randn((4096, D_QK))
    cache = quantize(latent).view(64, 64, 1, 656).to(DEVICE)
    for build, op in (("sgl", builds["sgl"].sparse_decode_fwd), ("vllm", vllm.sparse_decode_fwd)):
        for h in HEADS:
            q = torch.randn((1, 64, h, D_QK), dtype=torch.bfloat16, device=DEVICE)
            idx = torch.randint(0, 4096, (1, 64, 2048), dtype=torch.int32, device=DEVICE)
            heads[f"{build} h={h}"] = attempt(
                lambda: op(q, cache, idx, None, None, None, None, None, None, None, D_V, SCALE))


def main() -> int:
    path = Path(sys.argv[1])
    record = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "capability": list(torch.cuda.get_device_capability())}
    builds = load_builds()
    record["schemas"] = {name: (ns if isinstance(ns, str) else schemas(ns))
                         for name, ns in builds.items()}
    for step in (sparse_decode_heads, sparse_prefill, dense_decode):
        try:
            step(builds, record)
        except Exception:
            record.setdefault("failures", {})[step.__name__] = traceback.format_exc()
        path.write_text(json.dumps(record, indent=1))
        print(f"{step.__name__}: done", flush=True)
    print(json.dumps({k: v for k, v in record.items() if "traces" not in k and k != "schemas"},
                     indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
