# SPDX-License-Identifier: Apache-2.0
"""kiln.transformers: attn_implementation="kiln" in Hugging Face transformers.

On the CPU, kiln's calls are replaced by stand-ins built on the float64 reference
(reference.py), so these tests check kiln.transformers' mapping (layouts, masks, sliding
windows, softcap, sinks, GQA, the decode path), not the kernels: tiny random-weight Llama-style,
Gemma-2-style (sliding window and softcap on) and gpt-oss-style (sinks) models with
attn_implementation="kiln" against "eager", prefill logits and greedy generation, with and
without padding. The tests marked gpu
run the same models on the real kernels in bf16 and fp16 against eager in float32.
"""

import importlib.util
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if importlib.util.find_spec("kiln") is None:  # not installed: the source tree's
    sys.path.insert(0, os.path.dirname(HERE))

transformers = pytest.importorskip("transformers")

import kiln  # noqa: E402
import kiln.transformers as kiln_hf  # noqa: E402

try:
    from kiln import _capi as kiln_capi
except ImportError:  # the kiln package is not built here: needs_kiln skips what uses it
    kiln_capi = None
from reference import attention_ref, check_close, kvcache_ref  # noqa: E402

GENERATE = 8


# --- stand-ins for kiln's calls, on the reference ---------------------------------------------


class Calls:
    """What kiln.transformers handed to kiln, call by call."""

    def __init__(self):
        self.log = []

    def record(self, call, q, k, v, softmax_scale, causal, window_size, softcap, sinks, **fields):
        """Logs a call; returns the score options, as the reference takes them."""
        for t in (q, k, v):
            # kiln needs stride 1 on the last dim; the mapping must not have to copy for it.
            assert t.stride(-1) == 1, f"{call}: last-dim stride {t.stride(-1)}"
        window = tuple(window_size)
        log = dict(call=call, q=q, k=k, v=v, causal=causal, window=window, softcap=softcap)
        self.log.append(dict(log, scale=softmax_scale, sinks=sinks, **fields))
        return dict(
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            sinks=sinks,
        )

    def flash_attn_func(
        self,
        q,
        k,
        v,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        *,
        bias=None,
        top_left=False,
        return_softmax_lse=False,
        out=None,
        sinks=None,
        variant=None,
        variant_scalars=(),
        variant_tensors=(),
        q_descale=None,
        k_descale=None,
        v_descale=None,
    ):
        assert variant is None and not variant_scalars and not variant_tensors
        assert q_descale is None and k_descale is None and v_descale is None
        band = self.record(
            "func", q, k, v, softmax_scale, causal, window_size, softcap, sinks, bias=bias
        )
        result, _ = attention_ref(q, k, v, bias=bias, top_left=top_left, **band)
        return result.to(q.dtype)

    def flash_attn_with_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        block_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        rotary_interleaved=True,
        alibi_slopes=None,
        num_splits=0,
        return_softmax_lse=False,
        *,
        top_left=False,
        out=None,
        sinks=None,
        variant=None,
        variant_scalars=(),
        variant_tensors=(),
        q_descale=None,
        k_descale=None,
        v_descale=None,
        k_token_descale=None,
        v_token_descale=None,
    ):
        assert variant is None and not variant_scalars and not variant_tensors
        assert q_descale is None and k_descale is None and v_descale is None
        assert k_token_descale is None and v_token_descale is None
        band = self.record(
            "kvcache",
            q,
            k_cache,
            v_cache,
            softmax_scale,
            causal,
            window_size,
            softcap,
            sinks,
            bias=None,
            appended=k is not None,
        )
        result, _, _, _ = kvcache_ref(
            q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens, top_left=top_left, **band
        )
        return result.to(q.dtype)


needs_kiln = pytest.mark.skipif(
    not hasattr(kiln, "flash_attn_with_kvcache"), reason="the kiln package is not built here"
)


@needs_kiln
@pytest.mark.parametrize("name", ["flash_attn_func", "flash_attn_with_kvcache"])
def test_stand_ins_take_kilns_arguments(name):
    import inspect

    assert inspect.signature(getattr(Calls(), name)) == inspect.signature(getattr(kiln, name))


@pytest.fixture
def calls(monkeypatch):
    c = Calls()
    monkeypatch.setattr(kiln, "flash_attn_func", c.flash_attn_func, raising=False)
    monkeypatch.setattr(kiln, "flash_attn_with_kvcache", c.flash_attn_with_kvcache, raising=False)
    kiln_hf.register()
    return c


# --- tiny models ---------------------------------------------------------------------------------

VOCAB = 97
# Both models: GQA 4:2, head dim 16, weights large enough for sharp attention (so a wrong mask
# or window shows in the logits), token 0 for padding.
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)


def llama_config():
    return transformers.LlamaConfig(**SIZES)


def gemma2_config():
    # Layer 0 slides over the last 5 keys, layer 1 sees them all; the scale is not 1/sqrt(d);
    # softcap 5 bends the logits, which the large initializer makes big.
    return transformers.Gemma2Config(
        **SIZES,
        query_pre_attn_scalar=40,
        sliding_window=5,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"],
    )


def gpt_oss_config():
    # Attention sinks (a learned logit per head), a window of 5 on layer 0, mixture of experts.
    return transformers.GptOssConfig(
        **SIZES,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_scaling=None,
    )


CONFIGS = {"llama": llama_config, "gemma2": gemma2_config}
if hasattr(transformers, "GptOssConfig"):  # transformers 4.55 and newer
    CONFIGS["gpt_oss"] = gpt_oss_config


def model_pair(config_fn, dtype_kiln=torch.float32, dtype_eager=torch.float32, device="cpu"):
    """The same random weights as an eager model and a kiln one."""
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(config_fn(), attn_implementation="eager")
    with_kiln = transformers.AutoModelForCausalLM.from_config(
        config_fn(), attn_implementation="kiln"
    )
    with_kiln.load_state_dict(eager.state_dict())
    return (
        eager.to(device=device, dtype=dtype_eager).eval(),
        with_kiln.to(device=device, dtype=dtype_kiln).eval(),
    )


def prompts(device="cpu", padded=False):
    """A batch of 2 prompts of 13 tokens (longer than Gemma-2's window of 5); padded: the first
    one left-padded by 4, as batched generation pads."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, 13), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        ids[0, :4] = 0
        mask[0, :4] = 0
    return ids.to(device), mask.to(device)


def generate(model, ids, mask, **options):
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=GENERATE,
        do_sample=False,
        pad_token_id=0,
        min_new_tokens=GENERATE,
        **options,
    )
    return out[:, ids.shape[1] :]


# --- CPU: the mapping, on stand-ins ------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@torch.no_grad()
def test_prefill_and_generation_match_eager(calls, name, padded):
    eager, with_kiln = model_pair(CONFIGS[name])
    ids, mask = prompts(padded=padded)
    logits_eager = eager(input_ids=ids, attention_mask=mask).logits
    logits_kiln = with_kiln(input_ids=ids, attention_mask=mask).logits
    assert calls.log, "attn_implementation='kiln' never called kiln"
    real = mask.bool()  # padded positions' outputs are not compared: nothing reads them
    torch.testing.assert_close(logits_kiln[real], logits_eager[real], rtol=1e-4, atol=1e-4)

    calls.log.clear()
    tokens_eager = generate(eager, ids, mask)
    tokens_kiln = generate(with_kiln, ids, mask)
    assert torch.equal(tokens_kiln, tokens_eager), (tokens_kiln, tokens_eager)
    decode = [c for c in calls.log if c["q"].shape[1] == 1]
    assert len(decode) == (GENERATE - 1) * with_kiln.config.num_hidden_layers
    if padded:
        # The padding reaches kiln as a bias in prefill, and in every decode step of the full
        # layers (a sliding layer's cache drops the padding once it slides out of the window).
        assert all(c["bias"] is not None for c in calls.log if c["q"].shape[1] > 1)
        assert sum(c["bias"] is not None for c in decode) >= GENERATE - 1
    else:  # no mask: the band, and decode steps on the decode kernel, nothing appended
        assert all(c["bias"] is None for c in calls.log)
        assert all(c["call"] == "kvcache" and not c["appended"] for c in decode)


@pytest.mark.parametrize("name", CONFIGS)
@torch.no_grad()
def test_static_cache_generation_matches_eager(calls, name):
    """A static cache hands attention all its slots, the unused ones too: the mask (a bias)
    must hide them, the band alone would not."""
    eager, with_kiln = model_pair(CONFIGS[name])
    ids, mask = prompts()
    tokens_eager = generate(eager, ids, mask, cache_implementation="static")
    tokens_kiln = generate(with_kiln, ids, mask, cache_implementation="static")
    assert torch.equal(tokens_kiln, tokens_eager), (tokens_kiln, tokens_eager)
    assert any(c["bias"] is not None for c in calls.log)


@torch.no_grad()
def test_what_reaches_kiln(calls):
    """Layouts without copies, GQA unrepeated, the window, softcap and scale as FlashAttention
    takes them."""
    eager, with_kiln = model_pair(gemma2_config)
    seen = []
    forward = kiln_hf.attention_forward

    def recording(module, query, key, value, *args, **kwargs):
        seen.append((query, key, value))
        return forward(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register("kiln", recording)
    try:
        ids, mask = prompts()
        with_kiln(input_ids=ids, attention_mask=mask)
    finally:
        kiln_hf.register()
    config = with_kiln.config
    assert len(calls.log) == len(seen) == 2
    for layer, (call, (query, key, value)) in enumerate(zip(calls.log, seen)):
        for given, passed in ((query, call["q"]), (key, call["k"]), (value, call["v"])):
            # transformers' own tensors as (batch, seqlen, heads, d) views.
            assert passed.data_ptr() == given.data_ptr()
            assert passed.shape == given.transpose(1, 2).shape
            assert passed.stride() == given.transpose(1, 2).stride()
        assert call["k"].shape[2] == config.num_key_value_heads  # not repeated
        assert call["q"].shape[2] == config.num_attention_heads
        assert call["causal"] and call["bias"] is None
        assert call["softcap"] == config.attn_logit_softcapping
        assert call["scale"] == config.query_pre_attn_scalar**-0.5
        # transformers' sliding_window = w: the last w keys; FlashAttention's (w - 1, w - 1).
        w = config.sliding_window
        assert call["window"] == ((w - 1, w - 1) if layer == 0 else (-1, -1))


@torch.no_grad()
def test_mask_function():
    """None exactly where kiln's band is the mask; else transformers' mask as a 0 / -inf bias."""
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    config = gemma2_config()
    base = dict(
        batch_size=2,
        q_length=3,
        kv_length=7,
        q_offset=4,
        kv_offset=0,
        mask_function=causal_mask_function,
        allow_is_causal_skip=True,
        config=config,
        dtype=torch.float16,
    )
    assert kiln_hf.make_mask(**base) is None
    assert kiln_hf.make_mask(**base, attention_mask=torch.ones(2, 7, dtype=torch.bool)) is None
    sliding = dict(base, mask_function=sliding_window_causal_mask_function(5), local_size=5)
    assert kiln_hf.make_mask(**sliding) is None
    # A chunk size, not the sliding window: no band.
    assert kiln_hf.make_mask(**dict(sliding, local_size=3)) is not None

    padding = torch.ones(2, 7, dtype=torch.bool)
    padding[1, :2] = False
    bias = kiln_hf.make_mask(**base, attention_mask=padding)
    assert bias.dtype == torch.float16 and bias.shape == (2, 1, 3, 7)
    i = torch.arange(3).view(3, 1) + 4
    j = torch.arange(7).view(1, 7)
    expected = (j <= i).expand(2, 3, 7).clone()
    expected[1, :, :2] = False
    assert torch.equal(bias[:, 0] == 0, expected)
    assert torch.isneginf(bias[:, 0][~expected]).all()
    # A static cache's spare slots (the last query is not at the last key): a bias.
    assert kiln_hf.make_mask(**dict(base, kv_length=10)) is not None
    # Custom mask functions or packed sequences: transformers forbids the skip.
    assert kiln_hf.make_mask(**dict(base, allow_is_causal_skip=False)) is not None


@needs_kiln
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a GPU, the gpu tests run kiln on these calls"
)
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@torch.no_grad()
def test_kiln_accepts_every_call(as_gpu, monkeypatch, name, padded):
    """kiln's own checks (shapes, strides, alignment, dtypes, the bias, the window) on every call
    the mapping makes, prefill and generation, bf16: as_gpu sends CPU tensors as a GPU's, and
    with no GPU kiln stops after its checks for want of a driver. Each call must get that far;
    the stand-in then answers it."""
    stand_ins = Calls()
    refused = (kiln_capi.KILN_ERROR_INVALID_ARGUMENT, kiln_capi.KILN_ERROR_UNSUPPORTED)

    def checked(name):
        real, stand_in = getattr(kiln, name), getattr(stand_ins, name)

        def call(*args, **kwargs):
            with pytest.raises(kiln.KilnError) as error:
                real(*args, **kwargs)
            assert error.value.status not in refused, str(error.value)
            return stand_in(*args, **kwargs)

        return call

    for call in ("flash_attn_func", "flash_attn_with_kvcache"):
        monkeypatch.setattr(kiln, call, checked(call))
    kiln_hf.register()
    _, with_kiln = model_pair(CONFIGS[name], dtype_kiln=torch.bfloat16)
    ids, mask = prompts(padded=padded)
    generate(with_kiln, ids, mask)
    made = {c["call"] for c in stand_ins.log}
    assert made == {"func", "kvcache"} or (padded and made == {"func"}), made


def test_training_mode_under_no_grad_runs_and_dropout_raises(calls):
    eager, with_kiln = model_pair(llama_config)
    ids, mask = prompts()
    eager.train()
    with_kiln.train()  # the attention dropout is 0
    with torch.no_grad():
        logits_eager = eager(input_ids=ids, attention_mask=mask).logits
        logits_kiln = with_kiln(input_ids=ids, attention_mask=mask).logits
    assert calls.log, "attn_implementation='kiln' never called kiln"
    torch.testing.assert_close(logits_kiln, logits_eager, rtol=1e-4, atol=1e-4)
    module = with_kiln.model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 16)
    k = torch.randn(1, 2, 3, 16)
    for training in (True, False):
        module.train(training)
        with pytest.raises(NotImplementedError, match="has no dropout.*dropout=0.1"):
            kiln_hf.attention_forward(module, q, k, k, None, dropout=0.1)


def loss_of(model, ids, mask):
    """The causal LM loss over the prompt's real tokens, each predicted from a real one: a
    padding query row sees no key, which kiln answers with 0 and eager with its mean value."""
    unseen = mask == 0
    unseen[:, 1:] |= mask[:, :-1] == 0
    labels = ids.masked_fill(unseen, -100)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_training_gradients_match_eager(calls, name, padded):
    """model.train() with gradients through the mapping (on the stand-ins, which autograd
    differentiates): every parameter's gradient as eager's, gpt-oss's sinks included, which
    reach kiln as a differentiable float32 cast."""
    eager, with_kiln = model_pair(CONFIGS[name])
    eager.train()
    with_kiln.train()
    ids, mask = prompts(padded=padded)
    loss_of(eager, ids, mask).backward()
    loss_of(with_kiln, ids, mask).backward()
    assert calls.log and all(c["call"] == "func" for c in calls.log)
    if name == "gpt_oss":
        assert all(c["sinks"].requires_grad and c["sinks"].dtype == torch.float32
                   for c in calls.log)
    grads = dict(eager.named_parameters())
    for parameter_name, parameter in with_kiln.named_parameters():
        expected = grads[parameter_name].grad
        if expected is None:
            assert parameter.grad is None, parameter_name
            continue
        torch.testing.assert_close(parameter.grad, expected, rtol=1e-4, atol=1e-5,
                                   msg=parameter_name)


def test_a_training_step_of_one_token_runs_flash_attn_func(calls):
    """The decode kernel has no backward: with gradients, one query per sequence goes to
    flash_attn_func; without, to the decode kernel."""
    _, with_kiln = model_pair(llama_config)
    with_kiln.train()
    ids, mask = prompts()
    loss_of(with_kiln, ids[:, :1], mask[:, :1]).backward()
    assert [c["call"] for c in calls.log] == ["func"] * with_kiln.config.num_hidden_layers
    calls.log.clear()
    with torch.no_grad():
        with_kiln(input_ids=ids[:, :1], attention_mask=mask[:, :1])
    assert [c["call"] for c in calls.log] == ["kvcache"] * with_kiln.config.num_hidden_layers


# --- GPU: the real kernels ----------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU: the kiln kernels need one"
)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@torch.no_grad()
def test_gpu_models_match_eager(name, dtype, padded):
    """kiln in bf16/fp16 against eager in float32, FlashAttention's rule on the logits: kiln's
    error at most twice eager's own in the same dtype, plus 1e-5; greedy generation agrees
    with float32 eager wherever float32 eager's own margin exceeds that error."""
    kiln_hf.register()
    eager32, with_kiln = model_pair(CONFIGS[name], dtype, torch.float32, device="cuda")
    eager_low, _ = model_pair(CONFIGS[name], dtype, dtype, device="cuda")
    ids, mask = prompts("cuda", padded)
    real = mask.bool()
    ref = eager32(input_ids=ids, attention_mask=mask).logits[real]
    plain = eager_low(input_ids=ids, attention_mask=mask).logits[real]
    got = with_kiln(input_ids=ids, attention_mask=mask).logits[real]
    error, bound = check_close(got, ref, plain)

    tokens = generate(with_kiln, ids, mask)
    # Teacher-force kiln's tokens through float32 eager: each must be float32's choice, or
    # within the tolerance of it (a near tie that bf16/fp16 may break either way).
    full = torch.cat([ids, tokens], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
    logits = eager32(input_ids=full, attention_mask=full_mask).logits.double()
    steps = logits[:, ids.shape[1] - 1 : -1]
    chosen = steps.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    margin = steps.max(-1).values - chosen
    print(f"{name} {dtype}: logits error {error:.3g}, bound {bound:.3g}; margins {margin.tolist()}")
    assert (margin <= 2 * bound).all(), (tokens, margin, bound)
    assert (margin == 0).float().mean() >= 0.75, (tokens, margin)


@pytest.mark.gpu
@needs_gpu
def test_gpu_model_in_training_mode_under_no_grad():
    """Inference in training mode (dropout 0) on the real kernels: kiln's logits as eval
    mode's."""
    kiln_hf.register()
    _, with_kiln = model_pair(llama_config, torch.bfloat16, device="cuda")
    ids, mask = prompts("cuda")
    with torch.no_grad():
        evaluated = with_kiln(input_ids=ids, attention_mask=mask).logits
        with_kiln.train()
        trained = with_kiln(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(trained, evaluated)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_gpu_training_step_gradients_match_eager(name):
    """One training step on the real kernels in bf16: every parameter's gradient within
    FlashAttention's rule of float32 eager's (at most twice the error of eager's own in bf16,
    plus 1e-5)."""
    kiln_hf.register()
    eager32, with_kiln = model_pair(CONFIGS[name], torch.bfloat16, torch.float32, device="cuda")
    eager_low, _ = model_pair(CONFIGS[name], torch.bfloat16, torch.bfloat16, device="cuda")
    ids, mask = prompts("cuda")
    for model in (eager32, eager_low, with_kiln):
        model.train()
        loss_of(model, ids, mask).backward()
    reference, plain = dict(eager32.named_parameters()), dict(eager_low.named_parameters())
    for parameter_name, parameter in with_kiln.named_parameters():
        if reference[parameter_name].grad is None:
            continue
        try:
            check_close(parameter.grad, reference[parameter_name].grad,
                        plain[parameter_name].grad)
        except AssertionError as e:
            raise AssertionError(f"{name} {parameter_name}: {e}") from None


@pytest.mark.gpu
@needs_gpu
def test_gpu_training_loss_falls_as_eagers_does():
    """20 steps of AdamW on one batch, kiln against eager, both in bf16 from the same weights:
    kiln's loss falls as eager's does, step by step within a few percent of it."""
    kiln_hf.register()
    eager, with_kiln = model_pair(llama_config, torch.bfloat16, torch.bfloat16, device="cuda")
    ids, mask = prompts("cuda")
    losses = {}
    for label, model in (("eager", eager), ("kiln", with_kiln)):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[label] = []
        for _ in range(20):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(model, ids, mask)
            loss.backward()
            optimizer.step()
            losses[label].append(loss.item())
    print("eager", losses["eager"], "\nkiln", losses["kiln"])
    assert losses["eager"][-1] < 0.5 * losses["eager"][0]  # the test's premise: eager learns
    assert losses["kiln"][-1] < 0.5 * losses["kiln"][0]
    for step, (a, b) in enumerate(zip(losses["kiln"], losses["eager"])):
        assert abs(a - b) <= 0.05 * losses["eager"][0], (step, a, b)


@torch.no_grad()
def test_sinks_in_the_models_dtype_are_cast_once_per_value():
    """Without gradients, a bf16 sinks parameter is cast to float32 once, not per layer and
    step; an in-place update casts again; float32 sinks go as they are."""
    sinks = torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16))
    first = kiln_hf._float_sinks(sinks)
    assert first.dtype == torch.float32 and not first.requires_grad
    assert kiln_hf._float_sinks(sinks) is first
    sinks.mul_(2)
    again = kiln_hf._float_sinks(sinks)
    assert again is not first and again.tolist() == [3.0, -4.0, 0.5]
    full = torch.tensor([1.0, 2.0])
    assert kiln_hf._float_sinks(full).data_ptr() == full.data_ptr()


def test_trained_sinks_are_cast_so_that_their_gradient_reaches_the_parameter():
    sinks = torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16))
    cast = kiln_hf._float_sinks(sinks)
    assert cast.dtype == torch.float32 and cast.requires_grad
    (cast * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert sinks.grad.tolist() == [1.0, 2.0, 3.0]
