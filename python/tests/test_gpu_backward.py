# SPDX-License-Identifier: Apache-2.0
"""kiln's backward on a GPU: the gradients of every differentiable call (dq, dk, dv, dsinks, dbias)
against autograd through the float64 reference (python/tests/reference.py) with FlashAttention's
rule (the error at most twice that of the same computation done plainly in the input dtype, plus
1e-5); deterministic mode bitwise reproducible; the packed forms' gradients those of the
unpacked call; torch.compile(fullgraph=True) of forward and backward; a training step captured
in a CUDA graph. Gradients are allocated by kiln's op over memory just freed full of NaN, so an
element the backward leaves unwritten shows. Skipped without a GPU."""
import pytest
import torch

import kiln
from test_gpu import CASES as FORWARD_CASES
from test_gpu import example_variant, randn, varlen

pytestmark = pytest.mark.gpu
BF16, F16, F32, I32 = torch.bfloat16, torch.float16, torch.float32, torch.int32


def reference():
    import reference as ref  # python/tests/reference.py
    return ref


def leaf(*shape, dtype=BF16):
    return randn(*shape, dtype=dtype).requires_grad_()


def poison_like(*tensors):
    """Allocates and frees blocks of these tensors' sizes full of NaN, so that the caching
    allocator hands them to the gradients kiln's op allocates next."""
    blocks = [torch.full_like(t, float("nan")) for t in tensors]
    del blocks


def kiln_gradients(call, inputs, dout, **kw):
    """The gradients of call(**inputs, **kw) (each input that requires grad), given dout."""
    for t in inputs.values():
        if isinstance(t, torch.Tensor):
            t.grad = None
    trained = {name: t for name, t in inputs.items()
               if isinstance(t, torch.Tensor) and t.requires_grad}
    poison_like(*trained.values())
    out = call(**inputs, **kw)
    out.backward(dout)
    return {name: t.grad for name, t in trained.items()}


def reference_gradients(inputs, dout, upcast, **kw):
    """The same gradients by autograd through reference.attention_ref: in float64 (upcast), or
    plainly in the inputs' dtypes."""
    copies = {}
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t = t.detach().to(torch.float64 if upcast else t.dtype).requires_grad_()
        copies[name] = t
    out, _ = reference().attention_ref(**copies, upcast=upcast, **kw)
    out.backward(dout.to(out.dtype))
    return {name: t.grad for name, t in copies.items()
            if isinstance(t, torch.Tensor) and t.requires_grad}


def check_gradients(call, inputs, reference_kw=None, **kw):
    """kiln's gradients of call against the reference's (of reference_kw, when given, in place
    of kw), FlashAttention's rule on each."""
    ref = reference()
    q, v = inputs["q"], inputs["v"]
    dout = randn(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    got = kiln_gradients(call, inputs, dout, **kw)
    reference_kw = kw if reference_kw is None else reference_kw
    exact = reference_gradients(inputs, dout, True, **reference_kw)
    plain = reference_gradients(inputs, dout, False, **reference_kw)
    assert set(got) == set(exact)
    for name in got:
        assert got[name].dtype == inputs[name].dtype and got[name].shape == inputs[name].shape
        try:
            ref.check_close(got[name], exact[name], plain[name])
        except AssertionError as e:
            raise AssertionError(f"d{name}: {e}") from None
    return got


def flash_attn_func(q, k, v, **kw):
    return kiln.flash_attn_func(q, k, v, **kw)


# The forward's cases (test_gpu.py: GQA, MQA, causal, windows, softcap, dv != d, top-left, d 64
# to 256, odd sizes; in (3, 128, 77) rows 0 to 50 see no key, so their gradients are zero), and
# more: (batch, seqlen_q, seqlen_k, heads, heads_kv, d, dv, options).
CASES = FORWARD_CASES + [
    (1, 255, 255, 2, 2, 256, 256, {"causal": True}),
    (2, 1, 1, 2, 1, 8, 8, {}),
    (1, 1023, 17, 2, 1, 40, 40, {"causal": True}),
]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES)
def test_flash_attn_func_gradients(case, dtype):
    batch, sq, sk, h, hk, d, dv, kw = case
    inputs = dict(q=leaf(batch, sq, h, d, dtype=dtype), k=leaf(batch, sk, hk, d, dtype=dtype),
                  v=leaf(batch, sk, hk, dv, dtype=dtype))
    check_gradients(flash_attn_func, inputs, **kw)


def test_gradients_with_alibi_and_a_broadcast_bias():
    # Neither takes a gradient (the slopes, as FlashAttention; the bias, a mask here).
    slopes = torch.rand(2, 8, device="cuda", dtype=F32)
    bias = randn(1, 8, 50, 70).expand(2, 8, 50, 70)
    inputs = dict(q=leaf(2, 50, 8, 64), k=leaf(2, 70, 2, 64), v=leaf(2, 70, 2, 64))
    check_gradients(flash_attn_func, inputs, causal=True, alibi_slopes=slopes, bias=bias)


def test_a_variant_trains_as_the_built_in_it_writes():
    # ALiBi as a variant (examples/variants.hpp, declared additive), against the reference's
    # ALiBi; its slopes, a variant tensor, get no gradient.
    slopes = torch.rand(8, device="cuda", dtype=F32)
    inputs = dict(q=leaf(2, 50, 8, 64), k=leaf(2, 70, 2, 64), v=leaf(2, 70, 2, 64))
    check_gradients(flash_attn_func, inputs, dict(causal=True, alibi_slopes=slopes), causal=True,
                    variant=example_variant("alibi"), variant_tensors=[slopes])


def flash_attn_func_expanded_bias(q, k, v, bias, **kw):
    """flash_attn_func with `bias` expanded over the batch (stride 0), as a mask often is."""
    return kiln.flash_attn_func(q, k, v, bias=bias.expand(2, *bias.shape[1:]), **kw)


# A bias that requires grad: dbias of its shape, summed where it has size 1; a stride-0 expand
# gets one per batch, which autograd sums. Under a softcap, which the bias joins after.
@pytest.mark.parametrize("call, shape", [
    (flash_attn_func, (2, 8, 50, 70)), (flash_attn_func, (1, 8, 50, 70)),
    (flash_attn_func, (2, 1, 50, 70)), (flash_attn_func_expanded_bias, (1, 8, 50, 70))],
    ids=["full", "batch 1", "heads 1", "expanded over the batch"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_bias_gradients(call, shape, dtype):
    inputs = dict(q=leaf(2, 50, 8, 64, dtype=dtype), k=leaf(2, 70, 2, 64, dtype=dtype),
                  v=leaf(2, 70, 2, 64, dtype=dtype), bias=leaf(*shape, dtype=dtype))
    check_gradients(call, inputs, causal=True, softcap=5.0)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw):
    return kiln.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, VARLEN_MAX[0],
                                       VARLEN_MAX[1], **kw)


VARLEN_Q, VARLEN_K = [17, 1, 64, 113], [30, 1, 64, 200]
VARLEN_MAX = (max(VARLEN_Q), max(VARLEN_K))


def varlen_inputs(d=128, dtype=BF16):
    (cu_q, _), (cu_k, _) = varlen(VARLEN_Q), varlen(VARLEN_K)
    return dict(q=leaf(int(cu_q[-1]), 8, d, dtype=dtype), k=leaf(int(cu_k[-1]), 2, d, dtype=dtype),
                v=leaf(int(cu_k[-1]), 2, d, dtype=dtype), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (16, 4), "softcap": 20.0}])
def test_flash_attn_varlen_func_gradients(kw):
    check_gradients(flash_attn_varlen_func, varlen_inputs(), **kw)
    seqused = torch.tensor([20, 1, 33, 150], dtype=I32, device="cuda")
    check_gradients(flash_attn_varlen_func, varlen_inputs(64, F16), seqused_k=seqused, **kw)


def test_sinks_gradients():
    """dsinks, float32 (heads), in flash_attn_func (rows that see no key keep their sink) and
    varlen; sinks that need no gradient get none."""
    sinks = torch.tensor([4.0, -1.0, 6.5, 0.0, 2.0, 9.0, 1.5, -3.0], device="cuda")
    inputs = dict(q=leaf(2, 90, 8, 128), k=leaf(2, 40, 2, 128), v=leaf(2, 40, 2, 128),
                  sinks=sinks.clone().requires_grad_())
    got = check_gradients(flash_attn_func, inputs, causal=True)
    assert got["sinks"].dtype == F32 and got["sinks"].shape == (8,)
    inputs = dict(varlen_inputs(64), sinks=sinks.clone().requires_grad_())
    check_gradients(flash_attn_varlen_func, inputs, causal=True)
    inputs = dict(q=leaf(2, 90, 8, 128), k=leaf(2, 40, 2, 128), v=leaf(2, 40, 2, 128),
                  sinks=sinks)
    assert "sinks" not in check_gradients(flash_attn_func, inputs, causal=True)


def gradients_twice(call, inputs, **kw):
    dout = randn(*inputs["q"].shape[:-1], inputs["v"].shape[-1], dtype=inputs["q"].dtype)
    return [kiln_gradients(call, inputs, dout, deterministic=True, **kw) for _ in range(2)]


@pytest.mark.parametrize("name", ["gqa", "varlen", "d256"])
def test_deterministic_gradients_are_bitwise_reproducible(name):
    if name == "gqa":
        runs = gradients_twice(flash_attn_func, dict(q=leaf(2, 1000, 16, 128),
                                                     k=leaf(2, 1000, 2, 128),
                                                     v=leaf(2, 1000, 2, 128)), causal=True)
    elif name == "varlen":
        runs = gradients_twice(flash_attn_varlen_func, varlen_inputs())
    else:
        runs = gradients_twice(flash_attn_func, dict(q=leaf(1, 700, 4, 256),
                                                     k=leaf(1, 900, 4, 256),
                                                     v=leaf(1, 900, 4, 256)))
    for name_, first in runs[0].items():
        assert torch.equal(first, runs[1][name_]), name_


def test_packed_forms_have_the_unpacked_calls_gradients():
    dout = randn(2, 70, 4, 64)
    qkv = leaf(2, 70, 3, 4, 64)
    kiln.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True).backward(dout)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    kiln.flash_attn_func(q, k, v, causal=True, deterministic=True).backward(dout)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 2))

    q, kv = leaf(2, 70, 4, 64), leaf(2, 90, 2, 2, 64)
    kiln.flash_attn_kvpacked_func(q, kv, deterministic=True).backward(dout)
    q2, k, v = q.detach().clone().requires_grad_(), *(
        t.detach().clone().requires_grad_() for t in kv.unbind(2))
    kiln.flash_attn_func(q2, k, v, deterministic=True).backward(dout)
    assert torch.equal(q.grad, q2.grad)
    assert torch.equal(kv.grad, torch.stack([k.grad, v.grad], 2))

    cu, max_seqlen = varlen([17, 1, 64, 113])
    total = int(cu[-1])
    dout = randn(total, 4, 64)
    qkv = leaf(total, 3, 4, 64)
    kiln.flash_attn_varlen_qkvpacked_func(qkv, cu, max_seqlen, causal=True,
                                          deterministic=True).backward(dout)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(1))
    kiln.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True,
                                deterministic=True).backward(dout)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 1))

    q, kv = leaf(total, 4, 64), leaf(total, 2, 2, 64)
    kiln.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max_seqlen, max_seqlen,
                                         deterministic=True).backward(dout)
    q2, k, v = q.detach().clone().requires_grad_(), *(
        t.detach().clone().requires_grad_() for t in kv.unbind(1))
    kiln.flash_attn_varlen_func(q2, k, v, cu, cu, max_seqlen, max_seqlen,
                                deterministic=True).backward(dout)
    assert torch.equal(q.grad, q2.grad)
    assert torch.equal(kv.grad, torch.stack([k.grad, v.grad], 1))


def test_torch_compile_fullgraph_forward_and_backward():
    def loss_of(q, k, v, sinks):
        out = kiln.flash_attn_func(q, k, v, causal=True, sinks=sinks, deterministic=True)
        return (out.float() * 0.5).square().sum()
    inputs = [leaf(2, 128, 8, 64), leaf(2, 128, 2, 64), leaf(2, 128, 2, 64),
              leaf(8, dtype=F32)]
    loss_of(*inputs).backward()
    expected = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(loss_of, fullgraph=True)
    compiled(*inputs).backward()
    for t, grad in zip(inputs, expected):
        torch.testing.assert_close(t.grad, grad, rtol=0, atol=0)


def test_cuda_graph_replays_a_training_step():
    """A whole step, forward and backward, captured once warm (the pattern of PyTorch's CUDA
    graphs notes: gradients set to None before capture live in the graph's pool) and replayed on
    new inputs: each replay's gradients are eager's, bitwise (deterministic)."""
    q, k, v = leaf(2, 256, 8, 128), leaf(2, 256, 2, 128), leaf(2, 256, 2, 128)
    sinks = leaf(8, dtype=F32)
    dout = randn(2, 256, 8, 128)
    inputs = (q, k, v, sinks)

    def step():
        out = kiln.flash_attn_func(q, k, v, causal=True, sinks=sinks, deterministic=True)
        out.backward(dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm: loads the kernels before capture
            for t in inputs:
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in inputs:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        with torch.no_grad():
            for t in (*inputs, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        copies = [t.detach().clone().requires_grad_() for t in inputs]
        kiln.flash_attn_func(*copies[:3], causal=True, sinks=copies[3],
                             deterministic=True).backward(dout)
        for t, copy in zip(inputs, copies):
            torch.testing.assert_close(t.grad, copy.grad, rtol=0, atol=0)
