# SPDX-License-Identifier: Apache-2.0
"""kiln's autograd plumbing, no GPU needed: the functional ops' fake kernels (forward and
backward shapes and dtypes), their registration (torch.library.opcheck), gradients through every
differentiable call on meta tensors, torch.compile(fullgraph=True) tracing forward and backward
with no graph break, what reaches the backward op (deterministic, dsinks, dbias), and the
refusals, at
the forward, of what kiln's backward cannot differentiate."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln import ops

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
VARIANT = kiln.Variant("mine", "struct kiln_variant {};")
# A variant whose backward compiles (a logit hook declared additive), with a tensor and a scalar.
ADDITIVE = kiln.Variant("shifted", """struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                                float x) {
    return x + v.scalars[0] * kiln::variant_load<float>(v.tensors[0], at.key);
  }
};""")


def t(*shape, dtype=BF16, grad=True, device="meta"):
    """A tensor on `device` (meta: shapes and dtypes only), requiring grad when `grad`."""
    return torch.empty(*shape, dtype=dtype, device=device).requires_grad_(grad)


def cu(device="meta"):
    return t(3, dtype=I32, grad=False, device=device)


# Each differentiable call: (its inputs on a device, the call, its output's shape). GQA 8/2
# heads, head dim 64, v's 32 where v is apart (dv != d); varlen over 9 query and 11 key tokens.
CALLS = {
    "flash_attn_func": (
        lambda d: dict(q=t(2, 5, 8, 64, device=d), k=t(2, 7, 2, 64, device=d),
                       v=t(2, 7, 2, 32, device=d), sinks=t(8, dtype=F32, device=d)),
        lambda x: kiln.flash_attn_func(x["q"], x["k"], x["v"], causal=True, sinks=x["sinks"]),
        (2, 5, 8, 32)),
    # The bias broadcasts over the batch by stride 0: autograd sums kiln's dense dbias into the
    # (1, heads, seqlen_q, seqlen_k) tensor it expands.
    "flash_attn_func with a bias": (
        lambda d: dict(q=t(2, 5, 8, 64, device=d), k=t(2, 7, 2, 64, device=d),
                       v=t(2, 7, 2, 64, device=d), bias=t(1, 8, 5, 7, device=d)),
        lambda x: kiln.flash_attn_func(x["q"], x["k"], x["v"], bias=x["bias"].expand(2, 8, 5, 7)),
        (2, 5, 8, 64)),
    "flash_attn_varlen_func": (
        lambda d: dict(q=t(9, 8, 64, device=d), k=t(11, 2, 64, device=d),
                       v=t(11, 2, 32, device=d), cu_q=cu(d), cu_k=cu(d)),
        lambda x: kiln.flash_attn_varlen_func(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], 5, 7,
                                              window_size=(3, 0)),
        (9, 8, 32)),
    "flash_attn_func with a variant": (
        lambda d: dict(q=t(2, 5, 8, 64, device=d), k=t(2, 7, 2, 64, device=d),
                       v=t(2, 7, 2, 64, device=d), shift=t(7, dtype=F32, grad=False, device=d)),
        lambda x: kiln.flash_attn_func(x["q"], x["k"], x["v"], variant=ADDITIVE,
                                       variant_scalars=[0.5], variant_tensors=[x["shift"]]),
        (2, 5, 8, 64)),
    "flash_attn_qkvpacked_func": (
        lambda d: dict(qkv=t(2, 5, 3, 4, 64, device=d)),
        lambda x: kiln.flash_attn_qkvpacked_func(x["qkv"], causal=True),
        (2, 5, 4, 64)),
    "flash_attn_kvpacked_func": (
        lambda d: dict(q=t(2, 5, 8, 64, device=d), kv=t(2, 7, 2, 2, 64, device=d)),
        lambda x: kiln.flash_attn_kvpacked_func(x["q"], x["kv"], softcap=30.0),
        (2, 5, 8, 64)),
    "flash_attn_varlen_qkvpacked_func": (
        lambda d: dict(qkv=t(9, 3, 4, 64, device=d), cu=cu(d)),
        lambda x: kiln.flash_attn_varlen_qkvpacked_func(x["qkv"], x["cu"], 5, causal=True),
        (9, 4, 64)),
    "flash_attn_varlen_kvpacked_func": (
        lambda d: dict(q=t(9, 8, 64, device=d), kv=t(11, 2, 2, 64, device=d), cu_q=cu(d),
                       cu_k=cu(d)),
        lambda x: kiln.flash_attn_varlen_kvpacked_func(x["q"], x["kv"], x["cu_q"], x["cu_k"], 5,
                                                       7, sinks=None),
        (9, 8, 64)),
}


def leaves(inputs):
    return {name: x for name, x in inputs.items() if x.requires_grad}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gradients_have_their_inputs_shapes_and_dtypes(name):
    make, call, shape = CALLS[name]
    inputs = make("meta")
    out = call(inputs)
    assert out.shape == shape and out.dtype == BF16
    assert "kiln_attention_forward" in type(out.grad_fn).__name__
    out.float().sum().backward()
    for x in leaves(inputs).values():
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype


@pytest.mark.parametrize("name", sorted(CALLS))
def test_fake_tensors_record_the_backward(name):
    # FakeTensorMode's CUDA tensors: the forward's shapes, and a graph that reaches kiln's
    # backward (which the engine would run on a GPU).
    make, call, shape = CALLS[name]
    with FakeTensorMode():
        out = call(make("cuda"))
    assert out.shape == shape and out.device == torch.device("cuda", 0)
    assert "kiln_attention_forward" in type(out.grad_fn).__name__


def op_arguments(sinks_grad=True):
    """attention_forward's arguments for flash_attn_func's call in CALLS, on meta tensors."""
    q, k, v = t(2, 5, 8, 64), t(2, 7, 2, 64), t(2, 7, 2, 32)
    sinks = t(8, dtype=F32, grad=sinks_grad)
    return (q, k, v, None, None, None, None, None, 0, 0, 0.0, True, -1, -1, False, 0.0, sinks,
            None, None, [], [], False)


def test_the_forward_op_is_functional_with_an_autograd_formula():
    result = torch.library.opcheck(ops.attention_forward, op_arguments())
    assert set(result.values()) == {"SUCCESS"}, result


def test_the_backward_op_is_functional():
    q, k, v, *rest = op_arguments()
    out, lse = ops.attention_forward(q, k, v, *rest)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((2, 5, 8, 32), BF16, (2, 8, 5), F32)
    assert not lse.requires_grad  # FlashAttention's: the LSE is not differentiated
    sinks = rest[-6].detach()
    bias = t(1, 8, 5, 7, grad=False)  # of size 1 over the batch: dbias too
    arguments = (out.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse, bias, None,
                 None, None, None, 0, 0, 0.0, True, -1, -1, False, 0.0, sinks, None, None, [], [],
                 True, True, True)
    result = torch.library.opcheck(ops.attention_backward, arguments)
    assert set(result.values()) == {"SUCCESS"}, result
    dq, dk, dv, dsinks, dbias = ops.attention_backward(*arguments)
    assert [(g.shape, g.dtype) for g in (dq, dk, dv, dsinks, dbias)] == [
        ((2, 5, 8, 64), BF16), ((2, 7, 2, 64), BF16), ((2, 7, 2, 32), BF16), ((8,), F32),
        ((1, 8, 5, 7), BF16)]
    dsinks, dbias = ops.attention_backward(*arguments[:-2], False, False)[3:]
    assert dsinks.shape == dbias.shape == (0,)  # not asked for


class Recording(TorchDispatchMode):
    """The ops dispatched under it, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))

    def of(self, op):
        return [args for func, args in self.calls if func == op.default]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("sinks_grad", [False, True])
def test_deterministic_and_dsinks_reach_the_backward(deterministic, sinks_grad):
    q, k, v, *rest = op_arguments(sinks_grad)
    sinks = rest[-6]
    with Recording() as recording:
        out = kiln.flash_attn_func(q, k, v, causal=True, sinks=sinks,
                                   deterministic=deterministic)
        out.float().sum().backward()
    (forward,), (backward,) = (recording.of(torch.ops.kiln.attention_forward),
                               recording.of(torch.ops.kiln.attention_backward))
    assert forward[-1] is deterministic
    assert backward[-3:] == (deterministic, sinks_grad, False)  # no bias: no dbias
    assert (sinks.grad is not None) == sinks_grad
    assert not recording.of(torch.ops.kiln.attention)


def test_a_variant_reaches_the_forward_and_the_backward():
    q, k, v = q_k_v()
    shift = t(7, dtype=F32, grad=False)
    with Recording() as recording:
        out = kiln.flash_attn_func(q, k, v, variant=ADDITIVE, variant_scalars=[0.5],
                                   variant_tensors=[shift])
        out.float().sum().backward()
    (forward,), (backward,) = (recording.of(torch.ops.kiln.attention_forward),
                               recording.of(torch.ops.kiln.attention_backward))
    for name, code, scalars, tensors in (forward[-5:-1], backward[-7:-3]):
        assert (name, code, scalars) == ("shifted", ADDITIVE.code, [0.5])
        assert len(tensors) == 1 and tensors[0] is shift
    assert q.grad.shape == q.shape and shift.grad is None


def test_calls_that_need_no_gradient_keep_the_op_that_writes_into_its_outputs():
    # Under no_grad, or with no input that requires grad, the call is the inference one: the
    # op over caller-allocated outputs, which eager calls reach without the dispatcher.
    q, k, v = t(2, 5, 8, 64), t(2, 7, 2, 64), t(2, 7, 2, 64)
    for grad_mode, inputs in ((False, (q, k, v)), (True, (q.detach(), k.detach(), v.detach()))):
        with torch.set_grad_enabled(grad_mode), Recording() as recording:
            out = kiln.flash_attn_func(*inputs)
        assert not out.requires_grad
        assert recording.of(torch.ops.kiln.attention)
        assert not recording.of(torch.ops.kiln.attention_forward)


def compile_with_graphs(fn, **options):
    """fn compiled with fullgraph=True (a graph break is an error) through AOTAutograd, and the
    forward and backward graphs it made."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    return torch.compile(fn, fullgraph=True, backend=backend, **options), graphs


def kiln_ops(gm):
    return {str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("kiln.")}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_compile_fullgraph_traces_forward_and_backward(name):
    make, call, shape = CALLS[name]
    compiled, graphs = compile_with_graphs(lambda x: call(x).float().square().sum())
    inputs = make("meta")
    compiled(inputs).backward()
    assert [kiln_ops(g) for g in graphs["forward"]] == [{"kiln.attention_forward.default"}]
    assert [kiln_ops(g) for g in graphs["backward"]] == [{"kiln.attention_backward.default"}]
    for gm in graphs["forward"] + graphs["backward"]:
        assert "_local_scalar_dense" not in gm.code
    for x in leaves(inputs).values():
        assert x.grad.shape == x.shape


def test_compile_fullgraph_of_a_training_step_with_dynamic_shapes():
    def step(q, k, v):
        return kiln.flash_attn_func(q, k, v, causal=True).float().sum()
    compiled, graphs = compile_with_graphs(step, dynamic=True)
    for seqlen in (5, 9):
        q, k, v = t(2, seqlen, 8, 64), t(2, seqlen, 2, 64), t(2, seqlen, 2, 64)
        compiled(q, k, v).backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape
    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1


def test_dynamo_finds_no_graph_break_in_the_forward():
    q, k, v = t(2, 5, 8, 64), t(2, 7, 2, 64), t(2, 7, 2, 64)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(
        lambda q, k, v: kiln.flash_attn_func(q, k, v, causal=True).float().sum())(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


# --- refusals at the forward ---------------------------------------------------------------------

def q_k_v(grad=True):
    return t(2, 5, 8, 64, grad=grad), t(2, 7, 2, 64, grad=grad), t(2, 7, 2, 64, grad=grad)


REFUSED = {
    "alibi slopes require grad": (
        lambda q, k, v: kiln.flash_attn_func(q, k, v, alibi_slopes=t(8, dtype=F32)),
        kiln.KilnNotImplementedError,
        "alibi_slopes requires grad: kiln, as FlashAttention, computes no gradient for the ALiBi"),
    "a variant tensor that requires grad": (
        lambda q, k, v: kiln.flash_attn_func(q.detach(), k.detach(), v.detach(), variant=VARIANT,
                                             variant_tensors=[t(7, dtype=F32)]),
        kiln.KilnNotImplementedError,
        "variant_tensors[0] requires grad: kiln computes no gradient for a variant's tensors"),
    "out=": (
        lambda q, k, v: kiln.flash_attn_func(q, k, v, out=t(2, 5, 8, 64, grad=False)),
        kiln.KilnValueError,
        "out= with inputs that require grad (q, k, v): autograd cannot differentiate a call"),
    "fp8 k and v": (
        lambda q, k, v: kiln.flash_attn_func(q, k.detach().to(torch.float8_e4m3fn),
                                             v.detach().to(torch.float8_e4m3fn)),
        kiln.KilnNotImplementedError,
        "k of dtype e4m3 in a call whose inputs require grad: kiln's backward takes k and v in "
        "q's dtype, not fp8"),
    "a descale that requires grad": (
        lambda q, k, v: kiln.flash_attn_varlen_func(
            q[0].detach(), k[0].detach().to(torch.float8_e5m2),
            v[0].detach().to(torch.float8_e5m2), cu(), cu(), 5, 7, k_descale=t(2, 2, dtype=F32)),
        kiln.KilnNotImplementedError, "k of dtype e5m2 in a call whose inputs require grad"),
    "a descale with 16-bit k": (
        lambda q, k, v: kiln.flash_attn_func(q, k, v, v_descale=t(2, 2, dtype=F32, grad=False)),
        kiln.KilnValueError, "v_descale is for fp8 k and v, but k has dtype bf16: drop v_descale"),
    "dropout": (
        lambda q, k, v: kiln.flash_attn_func(q, k, v, dropout_p=0.1),
        kiln.KilnValueError, "dropout_p=0.1 is not supported by kiln"),
    "a varlen bias": (
        lambda q, k, v: kiln.flash_attn_varlen_func(q[0], k[0], v[0], cu(), cu(), 5, 7,
                                                    bias=t(1, 8, 5, 7)),
        kiln.KilnValueError, "bias with varlen is not supported: pad the batch instead"),
    "deterministic not a flag": (
        lambda q, k, v: kiln.flash_attn_func(q, k, v, deterministic="yes"),
        kiln.KilnTypeError, "deterministic is a str ('yes'): pass True or False"),
    "qkv not packed in threes": (
        lambda q, k, v: kiln.flash_attn_qkvpacked_func(t(2, 5, 2, 4, 64)),
        kiln.KilnValueError,
        "qkv has shape (2, 5, 2, 4, 64): its dim 2 must be 3, (batch, seqlen, 3, heads, "
        "head_dim)"),
    "kv not packed in twos": (
        lambda q, k, v: kiln.flash_attn_varlen_kvpacked_func(q[0], t(7, 3, 2, 64), cu(), cu(),
                                                             5, 7),
        kiln.KilnValueError, "kv has shape (7, 3, 2, 64): its dim 1 must be 2"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_backward_cannot_differentiate_is_refused_at_the_forward(name):
    call, kind, words = REFUSED[name]
    with pytest.raises(kind) as error:
        call(*q_k_v())
    assert words in str(error.value)
    assert isinstance(error.value, kiln.KilnError)


def test_without_gradients_those_features_run():
    # The same calls under no_grad are inference, which takes them all.
    q, k, v = q_k_v()
    with torch.no_grad():
        kiln.flash_attn_func(q, k, v, bias=t(2, 8, 5, 7), alibi_slopes=t(8, dtype=F32))
        kiln.flash_attn_func(q, k, v, variant=VARIANT, variant_tensors=[t(7, dtype=F32)])
        kiln.flash_attn_func(q, k, v, out=t(2, 5, 8, 64, grad=False))
    # A bias that needs no gradient (a mask) trains with q, k and v.
    out = kiln.flash_attn_func(q, k, v, bias=t(2, 8, 5, 7, grad=False))
    out.float().sum().backward()
    assert q.grad.shape == q.shape


def test_the_lse_is_returned_but_not_differentiated():
    q, k, v = q_k_v()
    out, lse = kiln.flash_attn_func(q, k, v, return_softmax_lse=True)
    assert out.requires_grad and not lse.requires_grad
    assert lse.shape == (2, 8, 5) and lse.dtype == F32


# --- the eager path ------------------------------------------------------------------------------

def test_eager_calls_record_the_ops_formula_around_the_implementations(as_gpu, monkeypatch):
    # CPU tensors sent as a GPU's, batch 0: the forward reaches libkiln, which checks it and
    # launches nothing. The backward's implementation is replaced by one that records its
    # arguments: what the eager path hands kiln_attention_backward, with no GPU.
    seen = []

    def backward(*arguments):
        seen.append(arguments)
        return ops._gradients(*arguments[1:4], arguments[19], arguments[6], False,
                              *arguments[-2:])
    monkeypatch.setitem(ops.direct, ops.attention_backward, backward)
    q, k, v = (t(0, 5, 8, 64, device="cpu"), t(0, 7, 2, 64, device="cpu"),
               t(0, 7, 2, 64, device="cpu"))
    sinks = t(8, dtype=F32, device="cpu")
    out = kiln.flash_attn_func(q, k, v, causal=True, sinks=sinks, deterministic=True)
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
    out.sum().backward()
    (arguments,) = seen
    dout = arguments[0]
    assert dout.shape == out.shape and dout.is_contiguous()
    assert all(a is b for a, b in zip(arguments[1:4], (q, k, v))) and arguments[19] is sinks
    assert arguments[-3:] == (True, True, False)  # deterministic, dsinks, dbias
    assert q.grad.shape == q.shape and sinks.grad.shape == (8,)


def test_eager_calls_hand_the_backward_the_variant(as_gpu, monkeypatch):
    seen = []

    def backward(*arguments):
        seen.append(arguments)
        return ops._gradients(*arguments[1:4], None, None, False, False, False)
    monkeypatch.setitem(ops.direct, ops.attention_backward, backward)
    q, k, v = (t(0, 5, 8, 64, device="cpu"), t(0, 7, 2, 64, device="cpu"),
               t(0, 7, 2, 64, device="cpu"))
    shift = t(7, dtype=F32, grad=False, device="cpu")
    out = kiln.flash_attn_func(q, k, v, variant=ADDITIVE, variant_scalars=[0.5],
                               variant_tensors=[shift])
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
    out.sum().backward()
    (arguments,) = seen
    name, code, scalars, tensors = arguments[20:24]
    assert (name, code, scalars) == ("shifted", ADDITIVE.code, [0.5])
    assert len(tensors) == 1 and tensors[0] is shift
    assert q.grad.shape == q.shape and shift.grad is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, the gpu tests run the backward")
@pytest.mark.parametrize("call", ["flash_attn_func", "flash_attn_varlen_func"])
def test_libkiln_takes_what_the_eager_backward_hands_it(as_gpu, call):
    # Batch 0, CPU tensors sent as a GPU's: libkiln checks every tensor of the backward the
    # eager path packs (dout, dq, dk, dv, the LSE, dsinks) and stops only for want of a GPU.
    sinks = t(8, dtype=F32, device="cpu")
    if call == "flash_attn_func":
        q, k, v = (t(0, 5, 8, 64, device="cpu"), t(0, 7, 2, 64, device="cpu"),
                   t(0, 7, 2, 32, device="cpu"))
        out = kiln.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    else:
        q, k, v = t(0, 8, 64, device="cpu"), t(0, 2, 64, device="cpu"), t(0, 2, 32, device="cpu")
        zeros = torch.zeros(1, dtype=I32)
        out = kiln.flash_attn_varlen_func(q, k, v, zeros, zeros, 0, 0, sinks=sinks)
    with pytest.raises(kiln.KilnError) as error:
        out.sum().backward()
    assert error.value.status == kiln._capi.KILN_ERROR_NOT_FOUND, str(error.value)
    assert "kiln_attention_backward needs a GPU" in str(error.value)
