# SPDX-License-Identifier: Apache-2.0
"""Every refusal: FlashAttention arguments kiln cannot honour, Python-side checks, and kiln's own
messages and statuses surfaced as KilnError; a backward through a call without one raises; a
kernel missing during CUDA graph capture names the fix. No GPU: kiln checks CPU tensors as
device 0's (conftest.as_gpu), and a problem with batch 0 returns before any launch."""
import math

import pytest
import torch

import kiln
from kiln import _capi

BF16, I32 = torch.bfloat16, torch.int32


def bf16(*shape):
    return torch.empty(*shape, dtype=BF16)


Q, K = bf16(0, 5, 8, 64), bf16(0, 7, 2, 64)  # batch 0: checked, never launched
QV, KV = bf16(0, 8, 64), bf16(0, 2, 64)
CU = torch.zeros(1, dtype=I32)
CACHE = bf16(4, 64, 2, 64)
FP8_CACHE = torch.empty(4, 64, 2, 64, dtype=torch.float8_e4m3fn)
FP8_K = torch.empty(0, 7, 2, 64, dtype=torch.float8_e4m3fn)
SEQLENS = torch.empty(0, dtype=I32)
VARIANT = kiln.Variant("mine", "struct kiln_variant {};")


def refused(kind, status, *words):
    """pytest.raises for a KilnError of `kind` and `status` whose message has every word; one
    for input kiln cannot take or run is a ValueError too, as the README promises."""
    class Check:
        def __enter__(self):
            self.raises = pytest.raises(kind)
            self.info = self.raises.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.raises.__exit__(*exc)
            assert self.info.value.status == status
            if status in (_capi.KILN_ERROR_INVALID_ARGUMENT, _capi.KILN_ERROR_UNSUPPORTED):
                assert isinstance(self.info.value, ValueError), repr(self.info.value)
            for word in words:
                assert word in str(self.info.value), (word, str(self.info.value))
            return handled
    return Check()


UNSUPPORTED = [
    ("flash_attn_func dropout_p", lambda: kiln.flash_attn_func(Q, K, K, 0.1), "dropout_p=0.1"),
    ("flash_attn_varlen_func dropout_p",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, 0, 0, dropout_p=0.5),
     "dropout_p=0.5"),
    ("flash_attn_func return_attn_probs",
     lambda: kiln.flash_attn_func(Q, K, K, return_attn_probs=True), "return_attn_probs=True"),
    ("flash_attn_varlen_func return_attn_probs",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, 0, 0, return_attn_probs=True),
     "return_softmax_lse=True"),
    ("flash_attn_varlen_func block_table",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, 0, 0,
                                         block_table=torch.empty(0, 1, dtype=I32)),
     "block_table="),
    ("flash_attn_with_kvcache q_descale",
     lambda: kiln.flash_attn_with_kvcache(Q, CACHE, CACHE, cache_seqlens=SEQLENS,
                                          q_descale=torch.ones(0, 2)), "q_descale="),
    ("flash_attn_with_kvcache cache_leftpad",
     lambda: kiln.flash_attn_with_kvcache(Q, CACHE, CACHE, cache_seqlens=SEQLENS,
                                          cache_leftpad=SEQLENS), "cache_leftpad="),
]


@pytest.mark.parametrize("name, call, word", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_flash_attention_arguments_kiln_cannot_honour_are_named(name, call, word):
    with refused(kiln.KilnError, _capi.KILN_ERROR_UNSUPPORTED, word, "not supported by kiln"):
        call()


INVALID = [
    ("window_size of one value", lambda: kiln.flash_attn_func(Q, K, K, window_size=(5,)),
     "window_size=(5,)"),
    ("window_size below -1", lambda: kiln.flash_attn_func(Q, K, K, window_size=(-2, 0)),
     "window_size=(-2, 0)"),
    ("window_size not numbers", lambda: kiln.flash_attn_func(Q, K, K, window_size="left"),
     "window_size='left'"),
    ("softmax_scale 0", lambda: kiln.flash_attn_func(Q, K, K, softmax_scale=0.0),
     "softmax_scale=0.0"),
    ("softmax_scale NaN", lambda: kiln.flash_attn_func(Q, K, K, softmax_scale=math.nan),
     "softmax_scale=nan"),
    ("softmax_scale negative",
     lambda: kiln.flash_attn_with_kvcache(Q, CACHE, CACHE, cache_seqlens=SEQLENS,
                                          softmax_scale=-1.0), "softmax_scale=-1.0"),
    ("max_seqlen_q a tensor",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, torch.tensor(5), 0),
     "max_seqlen_q is a Tensor (tensor(5)): pass a Python int"),
    ("max_seqlen_k a bool",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, 0, True), "max_seqlen_k is a bool"),
    ("q_descale with a 16-bit q",
     lambda: kiln.flash_attn_func(Q, FP8_K, FP8_K, q_descale=torch.ones(0, 8)),
     "q_descale is for an fp8 q, but q has dtype bf16: drop q_descale"),
    ("q_descale with a 16-bit varlen q",
     lambda: kiln.flash_attn_varlen_func(QV, KV, KV, CU, CU, 0, 0, q_descale=torch.ones(0, 8)),
     "q_descale is for an fp8 q"),
    ("out of the wrong shape", lambda: kiln.flash_attn_func(Q, K, K, out=bf16(0, 5, 8, 32)),
     "out has shape (0, 5, 8, 32)"),
    ("out of the wrong dtype",
     lambda: kiln.flash_attn_func(Q, K, K, out=torch.empty(0, 5, 8, 64, dtype=torch.float16)),
     "torch.float16"),
    ("merge_states with v_b but no lse_b",
     lambda: kiln.merge_states(bf16(0, 8, 32), torch.empty(0, 8), bf16(0, 8, 32)),
     "v_b with lse_b"),
    ("paged cache without cache_seqlens",
     lambda: kiln.flash_attn_with_kvcache(Q, CACHE, CACHE, block_table=torch.empty(0, 1,
                                                                                    dtype=I32)),
     "cache_seqlens is None with a block_table"),
    ("a dtype DLPack mapping kiln lacks",
     lambda: kiln.flash_attn_func(Q, K, K, alibi_slopes=torch.empty(8, dtype=torch.complex64)),
     "alibi_slopes has dtype torch.complex64"),
    ("warmup on the CPU", lambda: kiln.warmup("cpu"), "device=cpu"),
    ("a variant name that is no identifier", lambda: kiln.Variant("my variant", "struct x;"),
     "Variant name 'my variant' must be a C++ identifier"),
    ("a variant without code", lambda: kiln.Variant("mine", "  "), "Variant 'mine' has no code"),
    ("a variant that is no kiln.Variant",
     lambda: kiln.flash_attn_func(Q, K, K, variant=("mine", "struct x;")), "variant is a tuple"),
    ("variant scalars without a variant",
     lambda: kiln.flash_attn_func(Q, K, K, variant_scalars=[1.0]), "without a variant"),
    ("variant scalars that are no numbers",
     lambda: kiln.flash_attn_func(Q, K, K, variant=VARIANT, variant_scalars=["a"]),
     "variant_scalars[0] is a str ('a'): pass a number"),
    ("nine variant scalars",
     lambda: kiln.flash_attn_func(Q, K, K, variant=VARIANT, variant_scalars=[0.0] * 9),
     "variant_scalars has 9 values: a variant takes at most 8"),
    ("five variant tensors",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, cache_seqlens=SEQLENS,
                                          variant=VARIANT, variant_tensors=[CU] * 5),
     "variant_tensors has 5 tensors: a variant takes at most 4"),
]


@pytest.mark.parametrize("name, call, word", INVALID, ids=[i[0] for i in INVALID])
def test_python_side_checks_name_the_argument(as_gpu, name, call, word):
    with refused(kiln.KilnValueError, _capi.KILN_ERROR_INVALID_ARGUMENT, word):
        call()


# kiln's own checks, as the C API reports them.
KILN = [
    ("head dims differ", lambda: kiln.flash_attn_func(Q, bf16(0, 7, 2, 32), K),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "k.size(-1) is 32 but q.size(-1) (head_dim) is 64"),
    ("heads not a multiple", lambda: kiln.flash_attn_func(Q, bf16(0, 7, 3, 64), bf16(0, 7, 3, 64)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "multiple of the kv heads"),
    ("fp32 data", lambda: kiln.flash_attn_func(Q.float(), K.float(), K.float()),
     _capi.KILN_ERROR_UNSUPPORTED, "attention takes bf16 or f16"),
    ("k of another dtype than q", lambda: kiln.flash_attn_func(Q, K.half(), K),
     _capi.KILN_ERROR_INVALID_ARGUMENT,
     "k has dtype f16 but q has dtype bf16: attention takes (q, k and v, out) in the dtypes "
     "(bf16, bf16, bf16) or (f16, f16, f16) or (bf16, e4m3, bf16) or (f16, e4m3, f16) or "
     "(bf16, e5m2, bf16) or (f16, e5m2, f16) or (e4m3, e4m3, bf16) or (e4m3, e4m3, f16), so k "
     "needs bf16"),
    ("fp8 k with a bf16 v", lambda: kiln.flash_attn_func(Q, FP8_K, K),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "v has dtype bf16 but k has dtype e4m3"),
    ("a descale with bf16 k and v",
     lambda: kiln.flash_attn_func(Q, K, K, k_descale=torch.empty(0, 2)),
     _capi.KILN_ERROR_INVALID_ARGUMENT,
     "k_descale is for fp8 k and v, but k has dtype bf16: drop k_descale"),
    ("a descale of the wrong shape",
     lambda: kiln.flash_attn_func(Q, FP8_K, FP8_K, v_descale=torch.empty(0, 3)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "v_descale.size(-1) is 3 but k.size(2) (heads_kv) is 2"),
    ("fp8 keys appended into an fp8 cache",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], FP8_CACHE, FP8_CACHE, FP8_K[:, :1],
                                          FP8_K[:, :1], cache_seqlens=SEQLENS),
     _capi.KILN_ERROR_INVALID_ARGUMENT,
     "k has dtype e4m3 with an e4m3 cache: pass k and v in q's dtype (bf16)"),
    ("a descale with a bf16 cache",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, cache_seqlens=SEQLENS,
                                          k_descale=torch.empty(0, 2)),
     _capi.KILN_ERROR_INVALID_ARGUMENT,
     "cache.k_descale is for an fp8 cache, but the cache has dtype bf16"),
    ("an fp16 descale",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], FP8_CACHE, FP8_CACHE, cache_seqlens=SEQLENS,
                                          v_descale=torch.empty(0, 2, dtype=torch.float16)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "cache.v_descale has dtype f16: it must be float32"),
    ("a token descale without its pair",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], FP8_CACHE, FP8_CACHE, cache_seqlens=SEQLENS,
                                          k_token_descale=torch.empty(0, 7, 2)),
     _capi.KILN_ERROR_INVALID_ARGUMENT,
     "cache.k_token_descale and cache.v_token_descale come together: "
     "cache.v_token_descale is missing"),
    ("a token descale of rank 2",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], FP8_CACHE, FP8_CACHE, cache_seqlens=SEQLENS,
                                          k_token_descale=torch.empty(0, 7),
                                          v_token_descale=torch.empty(0, 7)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "cache.k_token_descale has rank 2 but must have rank 3"),
    ("negative softcap", lambda: kiln.flash_attn_func(Q, K, K, softcap=-1.0),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "softcap is -1"),
    ("bias of the wrong seqlen_k", lambda: kiln.flash_attn_func(Q, K, K, bias=bf16(0, 8, 5, 6)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "bias.size(-1) is 6 but seqlen_k is 7"),
    ("int64 cache_seqlens",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE,
                                          cache_seqlens=torch.empty(0, dtype=torch.int64)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "seqlens has dtype i64: it must be int32"),
    ("num_splits out of range",
     lambda: kiln.flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, cache_seqlens=SEQLENS,
                                          num_splits=1000),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "num_splits is 1000"),
    ("a variant tensor of rank 0",
     lambda: kiln.flash_attn_func(Q, K, K, variant=VARIANT, variant_tensors=[torch.empty(())]),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "variant_tensors[0]"),
    ("merge_states LSE of the wrong heads",
     lambda: kiln.merge_states(bf16(0, 8, 32), torch.empty(0, 7), bf16(0, 8, 32),
                               torch.empty(0, 8)),
     _capi.KILN_ERROR_INVALID_ARGUMENT, "size(-1) is 7 but heads is 8"),
]


@pytest.mark.parametrize("name, call, status, words", KILN, ids=[k[0] for k in KILN])
def test_kilns_own_messages_are_surfaced(as_gpu, name, call, status, words):
    with refused(kiln.KilnError, status, words):
        call()


def test_cpu_tensors_are_refused_in_words_not_dlpack_codes():
    for call in (lambda: kiln.flash_attn_func(Q, K, K),
                 lambda: kiln.flash_attn_func(Q.float(), K.float(), K.float()),  # CPU first
                 lambda: kiln.ops.attention(Q, K, K, Q.clone(), None, None, None, None, None,
                                            None, 0, 0, 0.0, False, -1, -1, False, 0.0, None,
                                            None, None, None, None, None, [], [])):
        with refused(kiln.KilnValueError, _capi.KILN_ERROR_INVALID_ARGUMENT,
                     "q is on the CPU; kiln runs on CUDA or ROCm GPUs", "q.cuda()") as error:
            call()
        assert "DLPack" not in str(error.value)


def test_a_valid_call_passes_kilns_checks(as_gpu):
    out, lse = kiln.flash_attn_func(Q, K, K, causal=True, return_softmax_lse=True)
    assert out.shape == Q.shape and lse.shape == (0, 8, 5)
    out, lse = kiln.flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, K[:, :1], K[:, :1],
                                            cache_seqlens=SEQLENS, return_softmax_lse=True)
    assert out.shape == (0, 1, 8, 64) and lse.shape == (0, 8, 1)
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):  # fp8 k and v with their descales
        out = kiln.flash_attn_func(Q, K.to(fp8), K.to(fp8), k_descale=torch.ones(0, 2),
                                   v_descale=torch.ones(0, 2))
        assert out.shape == Q.shape and out.dtype == BF16
        cache = CACHE.to(fp8)
        out = kiln.flash_attn_with_kvcache(Q[:, :1], cache, cache, cache_seqlens=SEQLENS,
                                           k_descale=torch.ones(0, 2), v_descale=torch.ones(0, 2))
        assert out.shape == (0, 1, 8, 64) and out.dtype == BF16
        token = torch.ones(cache.shape[:3])  # and per token
        out = kiln.flash_attn_with_kvcache(Q[:, :1], cache, cache, cache_seqlens=SEQLENS,
                                           k_token_descale=token, v_token_descale=token)
        assert out.shape == (0, 1, 8, 64)


def test_merge_states_takes_an_lse_of_any_strides(as_gpu):
    # flash_attn_func's LSE as lse[b].transpose(0, 1): kiln wants stride 1 over heads, and
    # merge_states copies it so. Its checks pass; what stops the call here is the missing GPU.
    lse = torch.zeros(1, 8, 4)[0].transpose(0, 1)
    assert lse.stride(-1) == 4
    with pytest.raises(kiln.KilnError) as error:
        kiln.merge_states(bf16(4, 8, 32), lse, bf16(4, 8, 32), lse)
    assert "stride" not in str(error.value) and "device 0" in str(error.value)


@pytest.mark.parametrize("call", [
    lambda q: kiln.flash_attn_with_kvcache(q, CACHE, CACHE, cache_seqlens=SEQLENS),
    lambda q: kiln.merge_states(q[:, 0], torch.empty(0, 8), q[:, 1], torch.empty(0, 8))[0],
], ids=["flash_attn_with_kvcache", "merge_states"])
def test_a_backward_through_a_call_without_one_raises_naming_those_with_one(as_gpu, call):
    q = Q.clone().requires_grad_()
    out = call(q)
    assert out.requires_grad
    with pytest.raises(kiln.KilnNotImplementedError,
                       match="has no backward: kiln differentiates flash_attn_func, "
                             "flash_attn_varlen_func and their qkvpacked and kvpacked") as error:
        out.float().sum().backward()
    assert isinstance(error.value, kiln.KilnError) and isinstance(error.value, NotImplementedError)
    assert error.value.status == _capi.KILN_ERROR_UNSUPPORTED
    with torch.no_grad():
        assert not call(q).requires_grad


def test_a_kernel_missing_during_graph_capture_names_kiln_warmup(as_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(kiln.KilnError, match=r"during CUDA graph capture: call "
                                             r"kiln.warmup\(device\)"):
        kiln.flash_attn_func(Q, bf16(0, 7, 2, 32), K)


# --- hostile arguments --------------------------------------------------------------------------

class Opaque:
    """An object kiln knows nothing of."""


# Values no argument of kiln's takes, or that only some take: each must be accepted, or refused
# with a KilnError that is a ValueError or TypeError naming the argument, never a bare IndexError,
# struct.error, OverflowError or AttributeError from deep inside.
HOSTILE = [2**64, -2**64, 2**32 - 1, 2**31, -2**31 - 1, -1, 1e300, -1e300, math.nan, math.inf,
           "x", "sm_90a\0x", b"bytes", None, (), (1,), (1, 2, 3), (2**40, 0), (1.5, 0), [1, 2],
           Opaque(), True, 3.5, torch.empty(()), torch.empty(5), torch.empty(2, 3, 4, 5, 6),
           torch.empty(0, 5, 8, 64, dtype=torch.complex64)]

# Each call on valid arguments (batch 0: checked, never launched), with every argument by
# name, so that any one can be replaced.
CALLS = {
    "flash_attn_func": (kiln.flash_attn_func, dict(
        q=Q, k=K, v=K, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, bias=None,
        top_left=False, return_softmax_lse=False, out=None, sinks=None, variant=None,
        variant_scalars=(), variant_tensors=())),
    "flash_attn_varlen_func": (kiln.flash_attn_varlen_func, dict(
        q=QV, k=KV, v=KV, cu_seqlens_q=CU, cu_seqlens_k=CU, max_seqlen_q=0, max_seqlen_k=0,
        dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
        alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
        seqused_k=None, bias=None, top_left=False, return_softmax_lse=False, out=None,
        sinks=None, variant=VARIANT, variant_scalars=(1.0,), variant_tensors=())),
    "flash_attn_with_kvcache": (kiln.flash_attn_with_kvcache, dict(
        q=Q[:, :1], k_cache=CACHE, v_cache=CACHE, k=None, v=None, rotary_cos=None,
        rotary_sin=None, cache_seqlens=SEQLENS, cache_batch_idx=None, cache_leftpad=None,
        block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
        rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
        top_left=False, out=None, sinks=None, variant=None, variant_scalars=(),
        variant_tensors=())),
    "merge_states": (kiln.merge_states, dict(
        v_a=bf16(0, 8, 32), lse_a=torch.empty(0, 8), v_b=bf16(0, 8, 32), lse_b=torch.empty(0, 8),
        out=None, out_lse=None)),
}
CASES = [(call, argument) for call, (_, arguments) in CALLS.items() for argument in arguments]


@pytest.mark.parametrize("call, argument", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_hostile_arguments_are_refused_naming_the_argument(as_gpu, call, argument):
    fn, arguments = CALLS[call]
    for value in HOSTILE:
        try:
            fn(**dict(arguments, **{argument: value}))
        except kiln.KilnError as e:
            assert isinstance(e, (ValueError, TypeError)), (value, repr(e))
            assert argument in str(e), (value, str(e))
        except Exception as e:  # noqa: BLE001 -- anything else is what this test is for
            pytest.fail(f"{call}({argument}={value!r}) raised {e!r}")


@pytest.mark.parametrize("arguments, words", [
    (dict(target="sm_90a\0x"), "target='sm_90a\\x00x' holds a NUL character"),
    (dict(target=90), "target is a int (90): pass a str such as 'sm_90a'"),
    (dict(device=2**32 - 1), "device is 4294967295: pass 0 to 2147483647"),
    (dict(device=-1), "device is -1: pass 0 to"),
    (dict(device=1.5), "device is a float (1.5)"),
    (dict(device="gpu:0"), "device='gpu:0' is no device torch knows"),
    (dict(threads=2**40, target="sm_90a"), "threads is 1099511627776: pass 0 to 2147483647"),
    (dict(threads="4", target="sm_90a"), "threads is a str ('4')"),
], ids=["NUL in target", "target an int", "device 2**32 - 1", "device -1", "device a float",
        "device a garbled name", "threads huge", "threads a str"])
def test_warmup_arguments_are_checked_before_c_sees_them(monkeypatch, arguments, words):
    def never(*args):
        raise AssertionError(f"kiln_warmup called with {args}")
    monkeypatch.setattr(_capi.lib, "kiln_warmup", never)
    with refused(kiln.KilnValueError, _capi.KILN_ERROR_INVALID_ARGUMENT, words):
        kiln.warmup(**arguments)


def test_warmup_without_a_gpu_says_so_in_python_words(monkeypatch):
    # A device beyond torch's: with no GPU here, device 0; on a GPU machine, one past the last.
    monkeypatch.delenv("KILN_TARGET", raising=False)
    with refused(kiln.KilnError, _capi.KILN_ERROR_NOT_FOUND, "kiln.warmup() loads kernels onto",
                 "to compile without a GPU", "kiln.warmup(target='sm_90a')") as error:
        kiln.warmup(torch.cuda.device_count())
    assert "kiln_warmup" not in str(error.value) and "KILN_TARGET" not in str(error.value)


def test_variant_code_with_a_nul_is_refused():
    with refused(kiln.KilnValueError, _capi.KILN_ERROR_INVALID_ARGUMENT, "NUL"):
        kiln.Variant("mine", "struct kiln_variant {};\0 garbage")
    with refused(kiln.KilnTypeError, _capi.KILN_ERROR_INVALID_ARGUMENT, "Variant name"):
        kiln.Variant(b"mine", "struct kiln_variant {};")
