# SPDX-License-Identifier: Apache-2.0
"""kiln's calls have FlashAttention's names, argument order and defaults (flash_attn 2.x's
flash_attn_interface, written out here), and take kiln's extras as keyword-only arguments."""
import inspect
import re

import pytest

import kiln

EMPTY = inspect.Parameter.empty

# FlashAttention 2.x's documented signatures: (name, default) in order; EMPTY: required.
FLASH_ATTN = {
    "flash_attn_func": [
        ("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_varlen_func": [
        ("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("cu_seqlens_q", EMPTY),
        ("cu_seqlens_k", EMPTY), ("max_seqlen_q", EMPTY), ("max_seqlen_k", EMPTY),
        ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
        ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False), ("block_table", None)],
    "flash_attn_with_kvcache": [
        ("q", EMPTY), ("k_cache", EMPTY), ("v_cache", EMPTY), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
        ("num_splits", 0), ("return_softmax_lse", False)],
}

# FlashAttention 2.x's packed forms: (name, default) in order. kiln's extras go on to the
# unpacked call (flash_attn_func or flash_attn_varlen_func) as **kiln_extras.
_OPTIONS = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
            ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
            ("deterministic", False), ("return_attn_probs", False)]
PACKED = {
    "flash_attn_qkvpacked_func": [("qkv", EMPTY)] + _OPTIONS,
    "flash_attn_kvpacked_func": [("q", EMPTY), ("kv", EMPTY)] + _OPTIONS,
    "flash_attn_varlen_qkvpacked_func": [("qkv", EMPTY), ("cu_seqlens", EMPTY),
                                         ("max_seqlen", EMPTY)] + _OPTIONS,
    "flash_attn_varlen_kvpacked_func": [
        ("q", EMPTY), ("kv", EMPTY), ("cu_seqlens_q", EMPTY), ("cu_seqlens_k", EMPTY),
        ("max_seqlen_q", EMPTY), ("max_seqlen_k", EMPTY)] + _OPTIONS,
}

# kiln's extras, keyword-only, with their defaults (FlashAttention-3's descales among them).
VARIANT = {"variant": None, "variant_scalars": (), "variant_tensors": ()}
EXTRAS = {
    "flash_attn_func": {"bias": None, "top_left": False, "return_softmax_lse": False,
                        "out": None, "sinks": None, **VARIANT, "q_descale": None,
                        "k_descale": None, "v_descale": None},
    "flash_attn_varlen_func": {"seqused_k": None, "bias": None, "top_left": False,
                               "return_softmax_lse": False, "out": None, "sinks": None,
                               **VARIANT, "q_descale": None, "k_descale": None,
                               "v_descale": None},
    "flash_attn_with_kvcache": {"top_left": False, "out": None, "sinks": None, **VARIANT,
                                "q_descale": None, "k_descale": None, "v_descale": None,
                                "k_token_descale": None, "v_token_descale": None},
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN))
def test_flash_attention_arguments_order_and_defaults(name):
    parameters = list(inspect.signature(getattr(kiln, name)).parameters.values())
    positional = [p for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == FLASH_ATTN[name]


@pytest.mark.parametrize("name", sorted(FLASH_ATTN))
def test_kilns_extras_are_keyword_only(name):
    parameters = inspect.signature(getattr(kiln, name)).parameters.values()
    extras = {p.name: p.default for p in parameters if p.kind == p.KEYWORD_ONLY}
    assert extras == EXTRAS[name]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_forms_take_flash_attentions_arguments_and_pass_kilns_extras_on(name):
    *parameters, extras = inspect.signature(getattr(kiln, name)).parameters.values()
    assert [(p.name, p.default, p.kind) for p in parameters] == [
        (n, default, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n, default in PACKED[name]]
    assert (extras.name, extras.kind) == ("kiln_extras", inspect.Parameter.VAR_KEYWORD)


def test_kilns_own_calls():
    def shape(fn):
        return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]
    P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    assert shape(kiln.merge_states) == [
        ("v_a", EMPTY, P), ("lse_a", EMPTY, P), ("v_b", None, P), ("lse_b", None, P),
        ("out", None, K), ("out_lse", None, K)]
    assert shape(kiln.warmup) == [("device", None, P), ("target", None, P), ("threads", 0, P),
                                  ("progress", None, K)]
    assert shape(kiln.info) == []
    for name in list(FLASH_ATTN) + list(PACKED) + ["merge_states", "warmup", "info"]:
        assert getattr(kiln, name).__doc__, f"kiln.{name} has no docstring"


def test_info_names_the_version_and_library():
    facts = kiln.info()
    assert facts["version"] == kiln.__version__
    assert facts["library"].endswith("libkiln.so")
    assert re.fullmatch(r"[0-9a-f]{12,}(-dirty)?|unknown", facts["build"]), facts["build"]
    assert set(facts) >= {"torch", "devices", "env"}
