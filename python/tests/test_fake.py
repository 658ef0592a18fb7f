# SPDX-License-Identifier: Apache-2.0
"""Shape inference with FakeTensorMode for every call and op, and torch.compile(fullgraph=True)
tracing through kiln with no graph break and no .item(): no GPU needed (fake and meta tensors
never reach kiln)."""
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln
from kiln import _checks, ops

BF16, I32, F32 = torch.bfloat16, torch.int32, torch.float32
VARIANT = kiln.Variant("scaled", """struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords&, float x) {
    return x * v.scalars[0];
  }
};""")


def tensors(device):
    """The inputs of every call, on `device`: GQA 8/2 heads, head dim 64, v's 32 (dv != d)."""
    t = {
        "q": torch.empty(2, 5, 8, 64, dtype=BF16, device=device),
        "k": torch.empty(2, 7, 2, 64, dtype=BF16, device=device),
        "v": torch.empty(2, 7, 2, 32, dtype=BF16, device=device),
        "qv": torch.empty(9, 8, 64, dtype=BF16, device=device),  # varlen, 9 query tokens
        "kv": torch.empty(11, 2, 64, dtype=BF16, device=device),
        "vv": torch.empty(11, 2, 32, dtype=BF16, device=device),
        "cu_q": torch.empty(3, dtype=I32, device=device),
        "cu_k": torch.empty(3, dtype=I32, device=device),
        "k_cache": torch.empty(16, 64, 2, 64, dtype=BF16, device=device),  # 16 pages of 64
        "v_cache": torch.empty(16, 64, 2, 32, dtype=BF16, device=device),
        "seqlens": torch.empty(2, dtype=I32, device=device),
        "table": torch.empty(2, 8, dtype=I32, device=device),
        "bias": torch.empty(1, 8, 5, 7, dtype=BF16, device=device).expand(2, 8, 5, 7),
        "states": torch.empty(6, 3, 8, 32, dtype=BF16, device=device),
        "state_lse": torch.empty(6, 3, 8, dtype=F32, device=device),
    }
    return t


# Each call on tensors(), and the shapes and dtypes of what it returns.
CALLS = {
    "flash_attn_func": (
        lambda t: kiln.flash_attn_func(t["q"], t["k"], t["v"], causal=True, bias=t["bias"],
                                       return_softmax_lse=True),
        [((2, 5, 8, 32), BF16), ((2, 8, 5), F32)]),
    "flash_attn_varlen_func": (
        lambda t: kiln.flash_attn_varlen_func(t["qv"], t["kv"], t["vv"], t["cu_q"], t["cu_k"],
                                              5, 7, window_size=(3, 0),
                                              return_softmax_lse=True),
        [((9, 8, 32), BF16), ((8, 9), F32)]),
    "flash_attn_with_kvcache": (
        lambda t: kiln.flash_attn_with_kvcache(t["q"][:, :1], t["k_cache"], t["v_cache"],
                                               t["k"][:, :1], t["v"][:, :1],
                                               cache_seqlens=t["seqlens"],
                                               block_table=t["table"], causal=True,
                                               return_softmax_lse=True),
        [((2, 1, 8, 32), BF16), ((2, 8, 1), F32)]),
    "flash_attn_func with a variant": (
        lambda t: kiln.flash_attn_func(t["q"], t["k"], t["v"], variant=VARIANT,
                                       variant_scalars=[0.5], variant_tensors=[t["seqlens"]]),
        [((2, 5, 8, 32), BF16)]),
    "flash_attn_with_kvcache contiguous, int cache_seqlens": (
        lambda t: kiln.flash_attn_with_kvcache(t["q"], t["k_cache"][:2], t["v_cache"][:2],
                                               cache_seqlens=3),
        [((2, 5, 8, 32), BF16)]),
    "merge_states two": (
        lambda t: kiln.merge_states(t["states"][:, 0], t["state_lse"][:, 0], t["states"][:, 1],
                                    t["state_lse"][:, 1]),
        [((6, 8, 32), BF16), ((6, 8), F32)]),
    "merge_states many": (
        lambda t: kiln.merge_states(t["states"], t["state_lse"]),
        [((6, 8, 32), BF16), ((6, 8), F32)]),
}


def flat(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_fake_tensor_shapes(name):
    call, expected = CALLS[name]
    with FakeTensorMode():
        results = flat(call(tensors("cuda")))
    assert [(tuple(r.shape), r.dtype) for r in results] == expected
    assert all(r.device == torch.device("cuda", 0) for r in results)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_meta_tensor_shapes(name):
    call, expected = CALLS[name]
    assert [(tuple(r.shape), r.dtype) for r in flat(call(tensors("meta")))] == expected


def compile_fullgraph(fn, backend="aot_eager"):
    """fn compiled with fullgraph=True (a graph break is an error), and the FX graphs Dynamo
    captured."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=recording), graphs


def test_the_compile_harness_fails_on_a_graph_break():
    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1
    compiled, _ = compile_fullgraph(breaks)
    with pytest.raises(Exception, match="graph_break|Graph break|graph break"):
        compiled(torch.empty(3, device="meta"))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_compile_fullgraph_traces_every_call(name):
    call, expected = CALLS[name]
    compiled, graphs = compile_fullgraph(lambda t: call(t))
    results = flat(compiled(tensors("meta")))
    assert [(tuple(r.shape), r.dtype) for r in results] == expected
    assert len(graphs) == 1
    code = graphs[0].code
    assert "torch.ops.kiln." in code
    assert ".item()" not in code and "_local_scalar_dense" not in code


def test_compile_fullgraph_over_a_decode_step_with_dynamic_shapes():
    def step(q, k_cache, v_cache, k, v, seqlens, table):
        out = kiln.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                           block_table=table, causal=True)
        return out.float().sum(-1)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=True)
    t = tensors("meta")
    for batch in (2, 3):
        q = torch.empty(batch, 1, 8, 64, dtype=BF16, device="meta")
        k = torch.empty(batch, 1, 2, 64, dtype=BF16, device="meta")
        v = torch.empty(batch, 1, 2, 32, dtype=BF16, device="meta")
        seqlens = torch.empty(batch, dtype=I32, device="meta")
        table = torch.empty(batch, 8, dtype=I32, device="meta")
        assert compiled(q, t["k_cache"], t["v_cache"], k, v, seqlens, table).shape == (batch, 1, 8)


def test_eager_calls_skip_the_dispatcher_only_on_plain_cuda_tensors():
    assert not ops.eager(torch.empty(2))  # CPU: through the op, so kiln names the device
    assert not ops.eager(torch.empty(2, device="meta"))
    with FakeTensorMode():
        assert not ops.eager(torch.empty(2, device="cuda"))


def test_every_op_is_registered_with_a_fake_kernel_and_its_mutations():
    for name, mutated in (("attention", {"out", "lse"}), ("attention_forward", set()),
                          ("attention_backward", set()),
                          ("attention_with_kvcache", {"k_cache", "v_cache", "out", "lse",
                                                      "k_token_descale", "v_token_descale"}),
                          ("merge_states", {"out", "out_lse"}),
                          ("merge_states_many", {"out", "out_lse"})):
        schema = getattr(torch.ops.kiln, name).default._schema
        written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
        assert written == mutated, name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            f"kiln::{name}", "Meta"), f"kiln::{name} has no fake/meta kernel"


# --- what tracing refuses: what the real call refuses ---------------------------------------------

def refusing_calls(device):
    """Calls the real op refuses for a dtype or head dim, on `device`'s tensors."""
    def t(*shape, dtype=BF16):
        return torch.empty(*shape, dtype=dtype, device=device)
    return {
        "head dim 59": (lambda: kiln.flash_attn_func(t(2, 5, 8, 59), t(2, 7, 2, 59),
                                                     t(2, 7, 2, 59)),
                        "head_dim (q.size(-1)) is 59: kiln compiles every multiple of 8"),
        "float32": (lambda: kiln.flash_attn_func(t(2, 5, 8, 64, dtype=F32),
                                                 t(2, 7, 2, 64, dtype=F32),
                                                 t(2, 7, 2, 64, dtype=F32)),
                    "q has dtype f32: attention takes bf16 or f16"),
        "v head dim 300": (lambda: kiln.flash_attn_varlen_func(t(9, 8, 64), t(11, 2, 64),
                                                               t(11, 2, 300), t(3, dtype=I32),
                                                               t(3, dtype=I32), 5, 7),
                           "head_dim_v (v.size(-1)) is 300"),
        "decode k of another dtype": (
            lambda: kiln.flash_attn_with_kvcache(t(2, 1, 8, 64), t(4, 64, 2, 64),
                                                 t(4, 64, 2, 64), t(2, 1, 2, 64, dtype=F32),
                                                 t(2, 1, 2, 64, dtype=F32),
                                                 cache_seqlens=t(2, dtype=I32)),
            "k has dtype f32 but q has dtype bf16"),
        "merge of int32 states": (
            lambda: kiln.merge_states(t(6, 8, 32, dtype=I32), t(6, 8, dtype=F32),
                                      t(6, 8, 32, dtype=I32), t(6, 8, dtype=F32)),
            "v_a has dtype i32: merge_states takes f16, bf16 or f32"),
        "int64 cache_seqlens": (
            lambda: kiln.flash_attn_with_kvcache(t(2, 1, 8, 64), t(4, 64, 2, 64),
                                                 t(4, 64, 2, 64),
                                                 cache_seqlens=t(2, dtype=torch.int64)),
            "cache_seqlens has dtype i64: it must be int32"),
    }


REFUSED = sorted(refusing_calls("meta"))


@pytest.mark.parametrize("name", REFUSED)
def test_meta_and_fake_tensors_are_refused_as_the_real_call_refuses(name):
    call, words = refusing_calls("meta")[name]
    with pytest.raises(ValueError, match=re.escape(words)) as error:
        call()
    assert isinstance(error.value, kiln.KilnError)
    with FakeTensorMode():
        call, _ = refusing_calls("cuda")[name]
        with pytest.raises(kiln.KilnError, match=re.escape(words)):
            call()


@pytest.mark.parametrize("name", REFUSED)
def test_torch_compile_refuses_what_the_real_call_refuses(name):
    call, words = refusing_calls("meta")[name]
    compiled, graphs = compile_fullgraph(call)
    with pytest.raises(Exception, match=re.escape(words)):
        compiled()
    assert not graphs


def library_verdict(q, k, v):
    """What libkiln itself says of flash_attn_func's q, k and v (batch 0: checked, never
    launched), past kiln's Python checks: None, or (status, message)."""
    try:
        ops._attention(q, k, v, q.new_empty(*q.shape[:3], v.shape[-1]), None, None, None, None,
                       None, None, 0, 0, 0.0, False, -1, -1, False, 0.0, None, None, None, None,
                       None, None, [], [])
    except kiln.KilnError as e:
        return e.status, e.message
    return None


def python_verdict(q, k, v):
    """What the fake kernels' check (kiln._checks) says of the same call."""
    try:
        _checks.attention(q, k, v, q.new_empty(*q.shape[:3], v.shape[-1]), None, None, None,
                          None, None, None, 0, 0, 0.0, False, -1, -1, False, 0.0, None, None,
                          None, None, None, None, [], [])
    except kiln.KilnError as e:
        return e.status, e.message
    return None


def test_the_python_rules_are_the_librarys_word_for_word(as_gpu):
    # Every head dim from 0 to 264 for q and k, then for v, and every dtype kiln packs: the
    # fake kernels' check refuses exactly what libkiln refuses, in the same words, so a real
    # call, which asks libkiln first, is refused as its trace is.
    def qkv(d, dv, dtype=BF16):
        return (torch.empty(0, 5, 8, d, dtype=dtype), torch.empty(0, 7, 2, d, dtype=dtype),
                torch.empty(0, 7, 2, dv, dtype=dtype))
    cases = [qkv(d, 64) for d in range(265)] + [qkv(64, d) for d in range(1, 265)]
    cases += [qkv(64, 64, dtype) for dtype in (torch.float16, F32, torch.float64, I32,
                                                torch.int64)]
    # And each of k and v in another dtype than q: the mixed-dtype refusal.
    q, k, v = qkv(64, 64)
    cases += [(q, k.half(), v), (q, k, v.half()), (q.half(), k, v)]
    # fp8 k and v, which the forward takes (with head dims multiples of 16), and k alone in fp8,
    # which it refuses.
    fp8 = torch.float8_e4m3fn
    cases += [(q, k.to(fp8), v.to(fp8)), (q.half(), k.to(fp8), v.to(fp8)), (q, k.to(fp8), v)]
    cases += [tuple(t.to(fp8) if i else t for i, t in enumerate(qkv(d, dv))) for d, dv in
              ((72, 64), (64, 40), (96, 80))]
    refused = 0
    for q, k, v in cases:
        expected = library_verdict(q, k, v)
        assert python_verdict(q, k, v) == expected, (q.shape, v.shape, q.dtype, k.dtype, v.dtype)
        refused += expected is not None
    assert refused == 265 + 264 - 2 * 32 + 4 + 3 + 1 + 2
