#!/usr/bin/python3
"""An independent float64 reference forward pass of the Hugging Face causal LMs pdserve serves.

Written from the semantics of the Hugging Face `transformers` modeling files (modeling_llama.py,
modeling_qwen2.py, modeling_qwen3.py, modeling_mistral.py, modeling_qwen3_moe.py) and of
DeepSeek's own modeling_deepseek.py (V2 and V3 repositories) and DeepSeek-V3's inference/model.py.
It is deliberately not derived from pdserve's C++: it exists to check the engine.

Where DeepSeek's inference/model.py and the HF DeepSeek code differ, DeepSeek's code is the
authority; every such place is marked with a comment starting "DEEPSEEK OVERRIDE".

Standard library + numpy only; run with Debian's /usr/bin/python3 (python3-numpy).

CLI:
  /usr/bin/python3 tests/reference/hf_reference.py --model DIR --prompt-ids 1,2,3 \
      [--prompt-ids 4,5] --tokens 24 --top 20 [--out FILE]

Everything is computed in float64: weights are widened (BF16/F16/F32/F8_E4M3 with block scales)
on load, activations, softmaxes, routing and logits stay float64.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint or config the reference refuses, with a message naming the tensor/file/field."""


# ---------------------------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------------------------

def _fp8_e4m3fn_table():
    """float8_e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
    exponent 1111 with mantissa 111 (0x7F, 0xFF) is NaN, every other code is finite
    (0x7E = 448 is the largest). Exponent 0 is subnormal: m/8 * 2^-6."""
    table = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> 3) & 0x0F
        mantissa = code & 0x07
        if exponent == 0x0F and mantissa == 0x07:
            table[code] = np.nan
        elif exponent == 0:
            table[code] = sign * (mantissa / 8.0) * 2.0 ** -6
        else:
            table[code] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return table


FP8_E4M3FN = _fp8_e4m3fn_table()
FP8_E4M3FN_MAX = 448.0


def fp8_e4m3fn_encode(values):
    """Round float values to the nearest float8_e4m3fn code (ties to the even code), saturating
    at +-448 (DeepSeek's conversion clamps to the finite range). Returns uint8 codes."""
    values = np.asarray(values, dtype=np.float64)
    if np.isnan(values).any():
        raise ValueError("cannot encode NaN as a finite fp8 weight")
    mags = np.minimum(np.abs(values), FP8_E4M3FN_MAX)
    positive = FP8_E4M3FN[:0x7F]  # codes 0x00..0x7E: monotonically increasing, 0 .. 448
    hi = np.clip(np.searchsorted(positive, mags, side="left"), 0, 0x7E)
    lo = np.clip(hi - 1, 0, 0x7E)
    d_hi = np.abs(positive[hi] - mags)
    d_lo = np.abs(mags - positive[lo])
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    codes = np.where(pick_lo, lo, hi).astype(np.uint8)
    negative = np.signbit(values) & (codes != 0)
    return np.where(negative, codes | 0x80, codes).astype(np.uint8)


def bf16_encode(values):
    """float -> bfloat16 bits (uint16), round to nearest even via float32 (what torch does)."""
    f32 = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_decode(bits):
    """bfloat16 bits (uint16) -> float64: the bits are the top half of a float32."""
    bits = np.asarray(bits, dtype=np.uint16)
    wide = np.ascontiguousarray(bits.astype(np.uint32).reshape(-1) << 16)
    return wide.view(np.float32).astype(np.float64).reshape(bits.shape)


# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header, then the raw data
# ---------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2),
    "BF16": (np.uint16, 2), "F8_E4M3": (np.uint8, 1),
    "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
    "U8": (np.uint8, 1), "BOOL": (np.bool_, 1),
}


class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) != 8:
                    raise CheckpointError(f"{path}: shorter than a safetensors header")
                (header_len,) = struct.unpack("<Q", raw)
                if header_len > size - 8:
                    raise CheckpointError(f"{path}: header length {header_len} past the end of "
                                          f"the file ({size} bytes)")
                header = json.loads(f.read(header_len).decode("utf-8"))
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read: {e}") from e
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: bad safetensors JSON header: {e}") from e
        self.metadata = header.pop("__metadata__", {}) or {}
        self.tensors = header
        self.data_start = 8 + header_len
        self.size = size
        for name, info in header.items():
            dtype = info.get("dtype")
            if dtype not in _ST_DTYPES:
                raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {dtype}")
            start, end = info["data_offsets"]
            count = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
            if end - start != count * _ST_DTYPES[dtype][1] or self.data_start + end > size:
                raise CheckpointError(f"{path}: tensor {name}: data_offsets {start}..{end} do not "
                                      f"match dtype {dtype} x shape {info['shape']} or the file")

    def dtype(self, name):
        return self.tensors[name]["dtype"]

    def shape(self, name):
        return tuple(self.tensors[name]["shape"])

    def raw(self, name):
        """The stored values, in their stored numpy dtype (BF16 as uint16, F8 as uint8)."""
        info = self.tensors[name]
        np_dtype, _ = _ST_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // np.dtype(np_dtype).itemsize
        arr = np.fromfile(self.path, dtype=np.dtype(np_dtype).newbyteorder("<"), count=count,
                          offset=self.data_start + start)
        return arr.reshape(info["shape"])

    def widened(self, name):
        """float64 values; F8_E4M3 is decoded but NOT block-scaled here (see Checkpoint.get)."""
        dtype = self.dtype(name)
        raw = self.raw(name)
        if dtype == "BF16":
            return bf16_decode(raw)
        if dtype == "F8_E4M3":
            return FP8_E4M3FN[raw]
        return raw.astype(np.float64)


class Checkpoint:
    """A Hugging Face model directory: config.json and model.safetensors or a sharded index."""

    def __init__(self, model_dir):
        self.dir = model_dir
        config_path = os.path.join(model_dir, "config.json")
        try:
            with open(config_path) as f:
                self.config = json.load(f)
        except OSError as e:
            raise CheckpointError(f"{config_path}: cannot read: {e}") from e
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{config_path}: bad JSON: {e}") from e
        self.generation_config = {}
        gen_path = os.path.join(model_dir, "generation_config.json")
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                self.generation_config = json.load(f)

        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        single_path = os.path.join(model_dir, "model.safetensors")
        self.files = {}
        self.where = {}  # tensor name -> SafetensorsFile
        if os.path.exists(index_path):
            self.source = index_path
            with open(index_path) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path}: no weight_map")
            for name, fname in weight_map.items():
                if fname not in self.files:
                    self.files[fname] = SafetensorsFile(os.path.join(model_dir, fname))
                st = self.files[fname]
                if name not in st.tensors:
                    raise CheckpointError(f"{index_path}: tensor {name} is mapped to {fname}, "
                                          f"which does not hold it")
                self.where[name] = st
        elif os.path.exists(single_path):
            self.source = single_path
            st = SafetensorsFile(single_path)
            self.files["model.safetensors"] = st
            for name in st.tensors:
                self.where[name] = st
        else:
            raise CheckpointError(f"{model_dir}: neither model.safetensors nor "
                                  f"model.safetensors.index.json")

        self.block_size = None
        qc = self.config.get("quantization_config")
        if qc is not None:
            method = qc.get("quant_method")
            if method != "fp8":
                raise CheckpointError(f"{config_path}: quantization_config.quant_method "
                                      f"{method!r} is not supported (only \"fp8\")")
            block = qc.get("weight_block_size")
            if (not isinstance(block, list) or len(block) != 2
                    or not all(isinstance(b, int) and b > 0 for b in block)):
                raise CheckpointError(f"{config_path}: quantization_config.weight_block_size "
                                      f"must be [rows, cols], got {block!r}")
            self.block_size = tuple(block)

    def has(self, name):
        return name in self.where

    def file_of(self, name):
        return self.where[name].path if name in self.where else self.source

    def missing_message(self, name):
        return f"tensor {name} is missing from the checkpoint ({self.source})"

    def get(self, name):
        """The tensor as float64; FP8 weights are dequantised with their weight_scale_inv."""
        if name not in self.where:
            raise CheckpointError(self.missing_message(name))
        st = self.where[name]
        values = st.widened(name)
        if st.dtype(name) != "F8_E4M3":
            return values
        scale_name = name[:-len("weight")] + "weight_scale_inv" if name.endswith("weight") \
            else name + "_scale_inv"
        if self.block_size is None:
            raise CheckpointError(f"tensor {name} in {st.path} is F8_E4M3 but config.json has no "
                                  f"quantization_config.weight_block_size")
        if scale_name not in self.where:
            raise CheckpointError(f"F8_E4M3 tensor {name} in {st.path} has no {scale_name} "
                                  f"(looked in {self.source})")
        scale = self.where[scale_name].widened(scale_name)
        return dequantize_blocks(values, scale, self.block_size, name=name,
                                 path=self.where[scale_name].path)


def dequantize_blocks(values, scale_inv, block_size, name="weight", path="?"):
    """DeepSeek's block FP8: weight [out, in] * scale_inv[i // bo, j // bi] (inference's
    weight_dequant). The last block of each dimension may be ragged."""
    if values.ndim != 2:
        raise CheckpointError(f"F8_E4M3 tensor {name} in {path} has shape {values.shape}, "
                              f"expected 2 dimensions")
    bo, bi = block_size
    out_dim, in_dim = values.shape
    expected = (-(-out_dim // bo), -(-in_dim // bi))
    if tuple(scale_inv.shape) != expected:
        raise CheckpointError(
            f"{name}_scale_inv in {path} has shape {list(scale_inv.shape)}, but weight {name} "
            f"{[out_dim, in_dim]} with the config's weight_block_size [{bo}, {bi}] needs "
            f"{list(expected)}")
    full = np.repeat(np.repeat(scale_inv, bo, axis=0), bi, axis=1)[:out_dim, :in_dim]
    return values * full


# ---------------------------------------------------------------------------------------------
# Building blocks (small functions the tests call)
# ---------------------------------------------------------------------------------------------

def rmsnorm(x, weight, eps):
    """HF *RMSNorm: x * rsqrt(mean(x^2) + eps) * weight (HF does it in float32; here float64)."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def linear(x, weight, bias=None):
    """nn.Linear: x @ W^T (+ b); weights are [out, in] as stored."""
    y = x @ weight.T
    return y if bias is None else y + bias


def mlp(x, gate, up, down):
    """LlamaMLP / Qwen*MLP / DeepseekV*MLP: down(silu(gate(x)) * up(x))."""
    return linear(silu(linear(x, gate)) * linear(x, up), down)


def topk_desc(scores, k):
    """Indices of the k largest values, largest first, ties to the lower index. (torch.topk leaves
    the order of equal values unspecified; this is the deterministic choice.)"""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((np.arange(scores.shape[-1]), -scores))
    return order[:k]


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x):
    m = np.max(x)
    return x - m - np.log(np.sum(np.exp(x - m)))


# --- RoPE -------------------------------------------------------------------------------------

def rope_inv_freq(dim, theta):
    """HF default: inv_freq[i] = 1 / theta^(2i/dim), i < dim/2."""
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def rope_inv_freq_llama3(dim, theta, factor, low_freq_factor, high_freq_factor, original_max):
    """HF _compute_llama3_parameters."""
    inv_freq = rope_inv_freq(dim, theta)
    low_freq_wavelen = original_max / low_freq_factor
    high_freq_wavelen = original_max / high_freq_factor
    wavelen = 2.0 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1.0 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def yarn_find_correction_dim(num_rotations, dim, base, max_position_embeddings):
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / \
        (2 * math.log(base))


def yarn_find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
    low = math.floor(yarn_find_correction_dim(low_rot, dim, base, max_position_embeddings))
    high = math.ceil(yarn_find_correction_dim(high_rot, dim, base, max_position_embeddings))
    return max(low, 0), min(high, dim - 1)


def yarn_get_mscale(scale=1.0, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_linear_ramp_mask(lo, hi, dim):
    if lo == hi:
        hi += 0.001  # as HF/DeepSeek: prevent a division by zero
    return np.clip((np.arange(dim, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)


def rope_inv_freq_yarn(dim, theta, factor, original_max, beta_fast=32, beta_slow=1):
    """DeepseekV2/V3YarnRotaryEmbedding._set_cos_sin_cache (same as inference/model.py's
    precompute_freqs_cis): interpolated frequencies for the low-frequency dimensions, the original
    ones for the high-frequency dimensions, a linear ramp between."""
    freq_extra = rope_inv_freq(dim, theta)
    freq_inter = 1.0 / (factor * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    low, high = yarn_find_correction_range(beta_fast, beta_slow, dim, theta, original_max)
    inv_freq_mask = 1.0 - yarn_linear_ramp_mask(low, high, dim // 2)
    return freq_inter * (1.0 - inv_freq_mask) + freq_extra * inv_freq_mask


def rope_cos_sin(positions, inv_freq, mscale=1.0):
    """cos/sin of positions x inv_freq, [T, dim/2] (HF duplicates them to [T, dim]; the rotation
    functions below take the half-width tables)."""
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    return np.cos(freqs) * mscale, np.sin(freqs) * mscale


def apply_rope_halves(x, cos, sin):
    """Llama/Qwen/Mistral (HF rotate_half): dimension i pairs with i + d/2.
    x [..., T, d], cos/sin [T, d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def apply_rope_adjacent(x, cos, sin):
    """DeepSeek: pairs of ADJACENT dimensions (2i, 2i+1) rotate by frequency i. This is
    inference/model.py's apply_rotary_emb (view as complex, multiply by freqs_cis). HF's
    modeling_deepseek de-interleaves (view(d/2, 2).transpose) and then uses rotate_half, which
    gives the same values in the permuted order [evens, odds] for both q and k, hence the same
    q.k; here the output keeps the interleaved order. x [..., T, d], cos/sin [T, d/2]."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xo * cos + xe * sin
    return out


# --- attention --------------------------------------------------------------------------------

def attention(q, k, v, q_pos, k_pos, scale, sliding_window=None):
    """Causal scaled-dot-product attention with grouped-query heads (HF repeat_kv: query head h
    reads kv head h // (H / Hkv)). q [H, T, d], k [Hkv, S, d], v [Hkv, S, dv]; returns [T, H*dv].
    sliding_window W (Mistral, HF masking_utils): key j is visible from query i iff
    i - W < j <= i."""
    n_heads, n_kv = q.shape[0], k.shape[0]
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads not a multiple of {n_kv} kv heads")
    group = n_heads // n_kv
    k = np.repeat(k, group, axis=0)
    v = np.repeat(v, group, axis=0)
    scores = np.einsum("htd,hsd->hts", q, k) * scale
    q_pos = np.asarray(q_pos)[:, None]
    k_pos = np.asarray(k_pos)[None, :]
    masked = k_pos > q_pos
    if sliding_window is not None:
        masked = masked | (k_pos <= q_pos - sliding_window)
    scores = np.where(masked[None], -np.inf, scores)
    probs = softmax(scores, axis=-1)
    out = np.einsum("hts,hsd->htd", probs, v)
    return out.transpose(1, 0, 2).reshape(q.shape[1], -1)


# --- routing ----------------------------------------------------------------------------------

def route_qwen3_moe(logits, top_k, norm_topk_prob):
    """Qwen3MoeSparseMoeBlock: softmax over all experts (HF: float32; here float64), top-k,
    renormalised over the chosen when norm_topk_prob. logits [E] -> (experts, weights)."""
    probs = softmax(np.asarray(logits, dtype=np.float64))
    idx = topk_desc(probs, top_k)
    w = probs[idx]
    if norm_topk_prob:
        w = w / w.sum()
    return idx, w


def route_deepseek(logits, *, version, top_k, scoring_func, topk_method, n_group, topk_group,
                   norm_topk_prob, routed_scaling_factor, bias=None, dropped_group_value=-np.inf):
    """DeepSeek MoEGate for one token. logits [E] (gate.weight @ x) -> (experts, weights).

    version 2 (modeling_deepseek.py of DeepSeek-V2): if top_k > 1 and norm_topk_prob, the chosen
      weights are renormalised and NOT scaled; otherwise they are multiplied by
      routed_scaling_factor.
    version 3 (modeling_deepseek.py of DeepSeek-V3): renormalised when top_k > 1 and
      norm_topk_prob, then ALWAYS multiplied by routed_scaling_factor.

    dropped_group_value: what the experts of the groups not kept score before the top-k.
      DEEPSEEK OVERRIDE: DeepSeek's inference/model.py (Gate.forward) fills them with -inf; HF's
      modeling_deepseek uses masked_fill(..., 0.0), which lets an expert of a dropped group win
      when the kept experts' (bias-corrected) scores are negative. -inf is the default; 0.0 is
      accepted only so a test can show the two differ.
    """
    logits = np.asarray(logits, dtype=np.float64)
    n_experts = logits.shape[-1]
    if scoring_func == "softmax":
        scores = softmax(logits)
    elif scoring_func == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        raise CheckpointError(f"config.json: scoring_func {scoring_func!r} is not supported "
                              f"(softmax or sigmoid)")

    if topk_method == "greedy":
        idx = topk_desc(scores, top_k)
    elif topk_method in ("group_limited_greedy", "noaux_tc"):
        if not n_group or n_experts % n_group:
            raise CheckpointError(f"config.json: n_group {n_group} does not divide "
                                  f"n_routed_experts {n_experts}")
        if topk_method == "noaux_tc":
            if bias is None:
                raise CheckpointError("noaux_tc routing needs mlp.gate.e_score_correction_bias")
            # The correction bias only chooses; the weights below are the un-biased scores.
            choice = scores + bias
            grouped = choice.reshape(n_group, n_experts // n_group)
            # group score = sum of the best two (HF V3: topk(2).sum; DeepSeek: same when a bias
            # exists)
            group_scores = np.array([np.sum(np.sort(g)[::-1][:2]) for g in grouped])
        else:
            choice = scores
            grouped = choice.reshape(n_group, n_experts // n_group)
            group_scores = grouped.max(axis=-1)  # HF V2 / DeepSeek without bias: amax
        kept = topk_desc(group_scores, topk_group)
        keep_mask = np.zeros(n_group, dtype=bool)
        keep_mask[kept] = True
        expert_kept = np.repeat(keep_mask, n_experts // n_group)
        # DEEPSEEK OVERRIDE: -inf (inference/model.py) instead of HF's 0.0 for dropped groups.
        masked = np.where(expert_kept, choice, dropped_group_value)
        idx = topk_desc(masked, top_k)
    else:
        raise CheckpointError(f"config.json: topk_method {topk_method!r} is not supported "
                              f"(greedy, group_limited_greedy, noaux_tc)")

    w = scores[idx]
    # DEEPSEEK OVERRIDE (no visible effect in float64): HF divides by sum + 1e-20; DeepSeek's
    # inference/model.py divides by the plain sum.
    if version == 2:
        if top_k > 1 and norm_topk_prob:
            w = w / w.sum()
        else:
            w = w * routed_scaling_factor
    else:
        if top_k > 1 and norm_topk_prob:
            w = w / w.sum()
        w = w * routed_scaling_factor  # HF V3: "must multiply the scaling factor"
    return idx, w


# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------

DENSE_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
MOE_ARCHS = ("Qwen3MoeForCausalLM",)
MLA_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
ARCHITECTURES = DENSE_ARCHS + MOE_ARCHS + MLA_ARCHS


def _req(cfg, field, arch):
    if cfg.get(field) is None:
        raise CheckpointError(f"config.json: {arch} needs the field {field}")
    return cfg[field]


def architecture_of(cfg):
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise CheckpointError("config.json: no architectures list")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"config.json: architecture {arch} is not implemented by the "
                              f"reference (supported: {', '.join(ARCHITECTURES)})")
    return arch


class Spec:
    """The config fields a forward pass needs, with the HF config classes' defaults."""

    def __init__(self, cfg):
        self.cfg = cfg
        arch = self.arch = architecture_of(cfg)
        self.hidden = _req(cfg, "hidden_size", arch)
        self.layers = _req(cfg, "num_hidden_layers", arch)
        self.heads = _req(cfg, "num_attention_heads", arch)
        self.vocab = _req(cfg, "vocab_size", arch)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        self.tie = bool(cfg.get("tie_word_embeddings", False))
        self.intermediate = cfg.get("intermediate_size")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (silu)")
        self.mla = arch in MLA_ARCHS
        if self.mla:
            self._init_mla(cfg)
        else:
            self._init_gqa(cfg)
        self._init_moe(cfg)

    # --- attention ---
    def _rope_type(self):
        rs = self.cfg.get("rope_scaling")
        if rs is None:
            return None, None
        if not isinstance(rs, dict):
            raise CheckpointError(f"config.json: rope_scaling must be an object, got {rs!r}")
        kind = rs.get("rope_type", rs.get("type"))
        return (None if kind == "default" else kind), rs

    def _init_gqa(self, cfg):
        arch = self.arch
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        if self.arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            self.head_dim = cfg.get("head_dim") or 128  # Qwen3Config default head_dim=128
        else:
            self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
        if arch == "Qwen2ForCausalLM":
            self.qkv_bias, self.o_bias = True, False
        else:
            bias = bool(cfg.get("attention_bias", False))
            self.qkv_bias, self.o_bias = bias, bias
        self.mlp_bias = arch == "LlamaForCausalLM" and bool(cfg.get("mlp_bias", False))
        self.scale = self.head_dim ** -0.5
        kind, rs = self._rope_type()
        if kind is None:
            self.inv_freq = rope_inv_freq(self.head_dim, self.theta)
        elif kind == "linear":
            self.inv_freq = rope_inv_freq(self.head_dim, self.theta) / rs["factor"]
        elif kind == "llama3":
            self.inv_freq = rope_inv_freq_llama3(
                self.head_dim, self.theta, rs["factor"], rs["low_freq_factor"],
                rs["high_freq_factor"], rs["original_max_position_embeddings"])
        else:
            raise CheckpointError(f"config.json: rope_scaling type {kind!r} is not implemented "
                                  f"by the reference for {arch} (none, linear, llama3)")
        self.rope_mscale = 1.0
        # Sliding window: Mistral applies config.sliding_window to every layer; Qwen2/Qwen3/
        # Qwen3-MoE only when use_sliding_window, to layers >= max_window_layers.
        # Newer configs may list layer_types ("sliding_attention" / "full_attention") instead.
        sw = cfg.get("sliding_window")
        layer_types = cfg.get("layer_types")
        if arch == "MistralForCausalLM":
            self.window = [sw] * self.layers
        elif arch != "LlamaForCausalLM" and isinstance(layer_types, list) and sw is not None:
            if len(layer_types) != self.layers:
                raise CheckpointError(f"config.json: layer_types has {len(layer_types)} entries "
                                      f"for {self.layers} layers")
            self.window = [sw if t == "sliding_attention" else None for t in layer_types]
        elif arch == "LlamaForCausalLM" or not cfg.get("use_sliding_window", False) or sw is None:
            self.window = [None] * self.layers
        else:
            mwl = cfg.get("max_window_layers", 0)
            self.window = [sw if i >= mwl else None for i in range(self.layers)]

    def _init_mla(self, cfg):
        arch = self.arch
        self.q_lora_rank = cfg.get("q_lora_rank")
        self.kv_lora_rank = _req(cfg, "kv_lora_rank", arch)
        self.qk_rope = _req(cfg, "qk_rope_head_dim", arch)
        self.qk_nope = _req(cfg, "qk_nope_head_dim", arch)
        self.v_head = _req(cfg, "v_head_dim", arch)
        self.q_head_dim = self.qk_nope + self.qk_rope
        self.kv_heads = self.heads
        self.attn_bias = bool(cfg.get("attention_bias", False))
        self.mlp_bias = False
        self.window = [None] * self.layers
        self.scale = deepseek_softmax_scale(cfg)
        kind, rs = self._rope_type()
        self.rope_mscale = 1.0
        if kind is None:
            self.inv_freq = rope_inv_freq(self.qk_rope, self.theta)
        elif kind == "linear":
            self.inv_freq = rope_inv_freq(self.qk_rope, self.theta) / rs["factor"]
        elif kind == "yarn":
            factor = rs["factor"]
            self.inv_freq = rope_inv_freq_yarn(
                self.qk_rope, self.theta, factor,
                rs.get("original_max_position_embeddings", 4096),
                rs.get("beta_fast", 32), rs.get("beta_slow", 1))
            # HF DeepseekV2/V3YarnRotaryEmbedding scales cos and sin by
            # yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim).
            # inference/model.py has no such factor; for every shipped config mscale ==
            # mscale_all_dim, so it is 1 and the two agree.
            self.rope_mscale = (yarn_get_mscale(factor, rs.get("mscale", 1)) /
                                yarn_get_mscale(factor, rs.get("mscale_all_dim", 0)))
        else:
            raise CheckpointError(f"config.json: rope_scaling type {kind!r} is not implemented "
                                  f"by the reference for {arch} (none, linear, yarn)")

    # --- feed-forward ---
    def _init_moe(self, cfg):
        arch = self.arch
        self.is_moe = [False] * self.layers
        self.n_experts = 0
        if arch == "Qwen3MoeForCausalLM":
            self.n_experts = cfg.get("num_experts", 0) or 0
            self.top_k = _req(cfg, "num_experts_per_tok", arch)
            self.moe_intermediate = _req(cfg, "moe_intermediate_size", arch)
            self.norm_topk_prob = bool(cfg.get("norm_topk_prob", False))
            step = cfg.get("decoder_sparse_step", 1)
            only = set(cfg.get("mlp_only_layers") or [])
            self.is_moe = [(i not in only) and self.n_experts > 0 and (i + 1) % step == 0
                           for i in range(self.layers)]
            self.n_shared = 0
        elif self.mla:
            v3 = arch == "DeepseekV3ForCausalLM"
            self.version = 3 if v3 else 2
            self.n_experts = cfg.get("n_routed_experts") or 0
            first_dense = cfg.get("first_k_dense_replace", 3 if v3 else 0)
            freq = cfg.get("moe_layer_freq", 1)
            # HF DeepseekV2/V3DecoderLayer: MoE iff n_routed_experts is not None and
            # layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
            self.is_moe = [self.n_experts > 0 and i >= first_dense and i % freq == 0
                           for i in range(self.layers)]
            if any(self.is_moe):
                self.top_k = _req(cfg, "num_experts_per_tok", arch)
                self.moe_intermediate = _req(cfg, "moe_intermediate_size", arch)
                self.n_shared = cfg.get("n_shared_experts") or 0
                # Defaults of the configuration_deepseek.py classes (V2's default topk_method is
                # the typo "gready", which its own code does not handle: treated as greedy).
                self.topk_method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
                if self.topk_method == "gready":
                    self.topk_method = "greedy"
                self.scoring_func = cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
                self.n_group = cfg.get("n_group", 8 if v3 else 1)
                self.topk_group = cfg.get("topk_group", 4 if v3 else 1)
                self.norm_topk_prob = bool(cfg.get("norm_topk_prob", v3))
                self.routed_scaling_factor = cfg.get("routed_scaling_factor", 2.5 if v3 else 1.0)
                if self.topk_method in ("group_limited_greedy", "noaux_tc"):
                    if not self.n_group or self.n_experts % self.n_group:
                        raise CheckpointError(
                            f"config.json: n_group {self.n_group} does not divide "
                            f"n_routed_experts {self.n_experts}")
                    if not 0 < self.topk_group <= self.n_group:
                        raise CheckpointError(f"config.json: topk_group {self.topk_group} must "
                                              f"be in 1..n_group ({self.n_group})")
                    per_group = self.n_experts // self.n_group
                    if self.topk_group * per_group < self.top_k:
                        raise CheckpointError(
                            f"config.json: topk_group {self.topk_group} groups of {per_group} "
                            f"experts hold fewer than num_experts_per_tok {self.top_k}")
                    if self.topk_method == "noaux_tc" and per_group < 2:
                        raise CheckpointError("config.json: noaux_tc needs >= 2 experts a group")
        if any(self.is_moe) and not 0 < self.top_k <= self.n_experts:
            raise CheckpointError(f"config.json: num_experts_per_tok {self.top_k} not in "
                                  f"1..{self.n_experts}")
        if not all(self.is_moe) and self.intermediate is None:
            raise CheckpointError(f"config.json: {arch} has dense layers but no intermediate_size")


def deepseek_softmax_scale(cfg):
    """DeepseekV2/V3Attention.softmax_scale: q_head_dim^-0.5, times mscale^2 where
    mscale = yarn_get_mscale(factor, mscale_all_dim) when rope_scaling has mscale_all_dim.
    (DeepSeek-V3/R1: 0.135234; V2-Lite: 0.114721 for q_head_dim 192 and factor 40.)
    inference/model.py applies it when max_seq_len > original_seq_len, which is how it is run for
    the long-context models; HF applies it whenever the config has it: HF followed here."""
    q_head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    scale = q_head_dim ** -0.5
    rs = cfg.get("rope_scaling")
    if rs is not None:
        mscale_all_dim = rs.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_get_mscale(rs["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


def tensor_shapes(cfg):
    """{name: shape} of every tensor the forward pass reads (the MTP layers, index >=
    num_hidden_layers, are not among them)."""
    s = Spec(cfg)
    D = s.hidden
    shapes = {"model.embed_tokens.weight": (s.vocab, D), "model.norm.weight": (D,)}
    if not s.tie:
        shapes["lm_head.weight"] = (s.vocab, D)
    for i in range(s.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (D,)
        shapes[p + "post_attention_layernorm.weight"] = (D,)
        a = p + "self_attn."
        if s.mla:
            if s.q_lora_rank:
                shapes[a + "q_a_proj.weight"] = (s.q_lora_rank, D)
                shapes[a + "q_a_layernorm.weight"] = (s.q_lora_rank,)
                shapes[a + "q_b_proj.weight"] = (s.heads * s.q_head_dim, s.q_lora_rank)
                if s.attn_bias:
                    shapes[a + "q_a_proj.bias"] = (s.q_lora_rank,)
            else:
                shapes[a + "q_proj.weight"] = (s.heads * s.q_head_dim, D)
            shapes[a + "kv_a_proj_with_mqa.weight"] = (s.kv_lora_rank + s.qk_rope, D)
            shapes[a + "kv_a_layernorm.weight"] = (s.kv_lora_rank,)
            shapes[a + "kv_b_proj.weight"] = (s.heads * (s.qk_nope + s.v_head), s.kv_lora_rank)
            shapes[a + "o_proj.weight"] = (D, s.heads * s.v_head)
            if s.attn_bias:
                shapes[a + "kv_a_proj_with_mqa.bias"] = (s.kv_lora_rank + s.qk_rope,)
                shapes[a + "o_proj.bias"] = (D,)
        else:
            hd = s.head_dim
            shapes[a + "q_proj.weight"] = (s.heads * hd, D)
            shapes[a + "k_proj.weight"] = (s.kv_heads * hd, D)
            shapes[a + "v_proj.weight"] = (s.kv_heads * hd, D)
            shapes[a + "o_proj.weight"] = (D, s.heads * hd)
            if s.qkv_bias:
                shapes[a + "q_proj.bias"] = (s.heads * hd,)
                shapes[a + "k_proj.bias"] = (s.kv_heads * hd,)
                shapes[a + "v_proj.bias"] = (s.kv_heads * hd,)
            if s.o_bias:
                shapes[a + "o_proj.bias"] = (D,)
            if s.qk_norm:
                shapes[a + "q_norm.weight"] = (hd,)
                shapes[a + "k_norm.weight"] = (hd,)
        m = p + "mlp."
        if s.is_moe[i]:
            shapes[m + "gate.weight"] = (s.n_experts, D)
            if s.arch != "Qwen3MoeForCausalLM" and s.topk_method == "noaux_tc":
                shapes[m + "gate.e_score_correction_bias"] = (s.n_experts,)
            for e in range(s.n_experts):
                shapes[m + f"experts.{e}.gate_proj.weight"] = (s.moe_intermediate, D)
                shapes[m + f"experts.{e}.up_proj.weight"] = (s.moe_intermediate, D)
                shapes[m + f"experts.{e}.down_proj.weight"] = (D, s.moe_intermediate)
            if s.n_shared:
                si = s.moe_intermediate * s.n_shared
                shapes[m + "shared_experts.gate_proj.weight"] = (si, D)
                shapes[m + "shared_experts.up_proj.weight"] = (si, D)
                shapes[m + "shared_experts.down_proj.weight"] = (D, si)
        else:
            shapes[m + "gate_proj.weight"] = (s.intermediate, D)
            shapes[m + "up_proj.weight"] = (s.intermediate, D)
            shapes[m + "down_proj.weight"] = (D, s.intermediate)
            if s.mlp_bias:
                shapes[m + "gate_proj.bias"] = (s.intermediate,)
                shapes[m + "up_proj.bias"] = (s.intermediate,)
                shapes[m + "down_proj.bias"] = (D,)
    return shapes


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

class Model:
    def __init__(self, model_dir):
        self.ckpt = Checkpoint(model_dir)
        self.cfg = self.ckpt.config
        self.spec = Spec(self.cfg)
        self.arch = self.spec.arch
        self.w = {}
        for name, shape in tensor_shapes(self.cfg).items():
            if not self.ckpt.has(name):
                parts = name.split(".")
                if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
                    layer = parts[2]
                    expert = parts[parts.index("experts") + 1]
                    raise CheckpointError(
                        f"expert {expert} of layer {layer} is missing from the shards: tensor "
                        f"{name} not found (looked in {self.ckpt.source})")
                raise CheckpointError(self.ckpt.missing_message(name))
            value = self.ckpt.get(name)
            if tuple(value.shape) != tuple(shape):
                raise CheckpointError(f"tensor {name} in {self.ckpt.file_of(name)} has shape "
                                      f"{list(value.shape)}, the config implies {list(shape)}")
            self.w[name] = value
        self.lm_head = self.w["model.embed_tokens.weight"] if self.spec.tie \
            else self.w["lm_head.weight"]

    # --- one decoder layer's pieces ---
    def _attn_gqa(self, i, h, positions, cache):
        s, w = self.spec, self.w
        a = f"model.layers.{i}.self_attn."
        T = h.shape[0]
        q = linear(h, w[a + "q_proj.weight"], w.get(a + "q_proj.bias"))
        k = linear(h, w[a + "k_proj.weight"], w.get(a + "k_proj.bias"))
        v = linear(h, w[a + "v_proj.weight"], w.get(a + "v_proj.bias"))
        q = q.reshape(T, s.heads, s.head_dim)
        k = k.reshape(T, s.kv_heads, s.head_dim)
        v = v.reshape(T, s.kv_heads, s.head_dim)
        if s.qk_norm:  # Qwen3: per-head RMSNorm of q and k, before RoPE
            q = rmsnorm(q, w[a + "q_norm.weight"], s.eps)
            k = rmsnorm(k, w[a + "k_norm.weight"], s.eps)
        q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))
        cos, sin = rope_cos_sin(positions, s.inv_freq)
        q = apply_rope_halves(q, cos, sin)
        k = apply_rope_halves(k, cos, sin)
        k_all, v_all, pos_all = cache.append(i, k, v, positions)
        o = attention(q, k_all, v_all, positions, pos_all, s.scale, s.window[i])
        return linear(o, w[a + "o_proj.weight"], w.get(a + "o_proj.bias"))

    def _attn_mla(self, i, h, positions, cache):
        s, w = self.spec, self.w
        a = f"model.layers.{i}.self_attn."
        T = h.shape[0]
        if s.q_lora_rank:
            q = linear(h, w[a + "q_a_proj.weight"], w.get(a + "q_a_proj.bias"))
            q = linear(rmsnorm(q, w[a + "q_a_layernorm.weight"], s.eps), w[a + "q_b_proj.weight"])
        else:
            q = linear(h, w[a + "q_proj.weight"])
        q = q.reshape(T, s.heads, s.q_head_dim).transpose(1, 0, 2)  # [H, T, q_head_dim]
        q_nope, q_pe = q[..., :s.qk_nope], q[..., s.qk_nope:]
        ckv = linear(h, w[a + "kv_a_proj_with_mqa.weight"], w.get(a + "kv_a_proj_with_mqa.bias"))
        c_kv, k_pe = ckv[:, :s.kv_lora_rank], ckv[:, s.kv_lora_rank:]
        kv = linear(rmsnorm(c_kv, w[a + "kv_a_layernorm.weight"], s.eps), w[a + "kv_b_proj.weight"])
        kv = kv.reshape(T, s.heads, s.qk_nope + s.v_head).transpose(1, 0, 2)
        k_nope, v = kv[..., :s.qk_nope], kv[..., s.qk_nope:]
        cos, sin = rope_cos_sin(positions, s.inv_freq, s.rope_mscale)
        q_pe = apply_rope_adjacent(q_pe, cos, sin)
        k_pe = apply_rope_adjacent(k_pe[None], cos, sin)  # one rope key shared by all heads
        q_full = np.concatenate([q_nope, q_pe], axis=-1)
        k_full = np.concatenate([k_nope, np.broadcast_to(k_pe, (s.heads,) + k_pe.shape[1:])],
                                axis=-1)
        k_all, v_all, pos_all = cache.append(i, k_full, v, positions)
        o = attention(q_full, k_all, v_all, positions, pos_all, s.scale)
        return linear(o, w[a + "o_proj.weight"], w.get(a + "o_proj.bias"))

    def route(self, i, x):
        """Routing of layer i for the rows of x: list of (experts, weights)."""
        s, w = self.spec, self.w
        m = f"model.layers.{i}.mlp."
        logits = linear(x, w[m + "gate.weight"])
        out = []
        for row in logits:
            if s.arch == "Qwen3MoeForCausalLM":
                out.append(route_qwen3_moe(row, s.top_k, s.norm_topk_prob))
            else:
                out.append(route_deepseek(
                    row, version=s.version, top_k=s.top_k, scoring_func=s.scoring_func,
                    topk_method=s.topk_method, n_group=s.n_group, topk_group=s.topk_group,
                    norm_topk_prob=s.norm_topk_prob,
                    routed_scaling_factor=s.routed_scaling_factor,
                    bias=w.get(m + "gate.e_score_correction_bias")))
        return out

    def _ffn(self, i, h):
        s, w = self.spec, self.w
        m = f"model.layers.{i}.mlp."
        if not s.is_moe[i]:
            y = linear(silu(linear(h, w[m + "gate_proj.weight"], w.get(m + "gate_proj.bias")))
                       * linear(h, w[m + "up_proj.weight"], w.get(m + "up_proj.bias")),
                       w[m + "down_proj.weight"], w.get(m + "down_proj.bias"))
            return y, None
        routes = self.route(i, h)
        y = np.zeros_like(h)
        for t, (idx, weights) in enumerate(routes):
            x = h[t:t + 1]
            for e, g in zip(idx, weights):
                p = m + f"experts.{e}."
                y[t] += g * mlp(x, w[p + "gate_proj.weight"], w[p + "up_proj.weight"],
                                w[p + "down_proj.weight"])[0]
        if s.n_shared:  # DeepSeek: shared experts always on, added after the routed sum
            p = m + "shared_experts."
            y = y + mlp(h, w[p + "gate_proj.weight"], w[p + "up_proj.weight"],
                        w[p + "down_proj.weight"])
        return y, routes

    def forward(self, ids, start, cache, routing=None):
        """Run tokens ids at positions start.. through the model; returns the float64 logits of
        the last token. Appends {"layer", "position", "experts", "weights"} to routing."""
        s, w = self.spec, self.w
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= s.vocab:
            raise ValueError(f"token id out of range 0..{s.vocab - 1}")
        positions = np.arange(start, start + len(ids))
        x = w["model.embed_tokens.weight"][ids]
        for i in range(s.layers):
            p = f"model.layers.{i}."
            h = rmsnorm(x, w[p + "input_layernorm.weight"], s.eps)
            if s.mla:
                h = self._attn_mla(i, h, positions, cache)
            else:
                h = self._attn_gqa(i, h, positions, cache)
            x = x + h
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], s.eps)
            h, routes = self._ffn(i, h)
            x = x + h
            if routes is not None and routing is not None:
                for t, (idx, weights) in enumerate(routes):
                    routing.append({"layer": i, "position": int(positions[t]),
                                    "experts": [int(e) for e in idx],
                                    "weights": [float(g) for g in weights]})
        x = rmsnorm(x[-1:], w["model.norm.weight"], s.eps)
        return linear(x, self.lm_head)[0]

    def generate(self, prompt, tokens, top=20):
        """Greedy continuation (EOS ignored). steps[i] is the distribution that produced
        greedy[i]. Positions run from 0; a float64 KV cache; the prompt is one forward pass. The
        last generated token is not run through the model, so routing covers positions
        0 .. len(prompt) + tokens - 2."""
        if not prompt:
            raise ValueError("empty prompt")
        cache = KVCache(self.spec.layers)
        routing = []
        greedy, steps = [], []
        logits = self.forward(prompt, 0, cache, routing)
        for n in range(tokens):
            lp = log_softmax(logits)
            tok = int(np.argmax(logits))  # first maximum: ties to the lowest id
            order = np.lexsort((np.arange(lp.shape[0]), -lp))[:top]
            greedy.append(tok)
            steps.append({"token": tok, "top": [[int(j), float(lp[j])] for j in order]})
            if n + 1 < tokens:
                logits = self.forward([tok], len(prompt) + n, cache, routing)
        routing.sort(key=lambda r: (r["position"], r["layer"]))
        return {"prompt": [int(t) for t in prompt], "greedy": greedy, "steps": steps,
                "routing": routing}


class KVCache:
    """float64 keys/values per layer (for MLA: the decompressed per-head keys and values)."""

    def __init__(self, layers):
        self.k = [None] * layers
        self.v = [None] * layers
        self.pos = [None] * layers

    def append(self, layer, k, v, positions):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
            self.pos[layer] = np.asarray(positions)
        else:
            self.k[layer] = np.concatenate([self.k[layer], k], axis=1)
            self.v[layer] = np.concatenate([self.v[layer], v], axis=1)
            self.pos[layer] = np.concatenate([self.pos[layer], positions])
        return self.k[layer], self.v[layer], self.pos[layer]


def run(model_dir, prompts, tokens=24, top=20):
    model = Model(model_dir)
    return {"architecture": model.arch,
            "prompts": [model.generate(p, tokens, top) for p in prompts]}


# ---------------------------------------------------------------------------------------------
# Checkpoint writer (for tests: hostile checkpoints, tiny MoE/MLA models)
# ---------------------------------------------------------------------------------------------

def _is_fp8_candidate(name, value):
    """The weights DeepSeek ships in FP8: the 2-D linear weights, except the embeddings, the
    output head and the router (mlp.gate)."""
    return (value.ndim == 2 and name.endswith(".weight")
            and not name.endswith("embed_tokens.weight") and name != "lm_head.weight"
            and not name.endswith("mlp.gate.weight")
            and not name.endswith("shared_head.head.weight"))


def quantize_blocks(value, block_size):
    """float [out, in] -> (fp8 codes uint8, scale_inv float32 [ceil(out/bo), ceil(in/bi)]),
    per block scale = amax / 448, as DeepSeek's cast does."""
    bo, bi = block_size
    out_dim, in_dim = value.shape
    rows, cols = -(-out_dim // bo), -(-in_dim // bi)
    scale = np.empty((rows, cols), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            amax = np.max(np.abs(value[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi]))
            scale[r, c] = np.float32(amax / FP8_E4M3FN_MAX) if amax > 0 else np.float32(1.0)
    full = np.repeat(np.repeat(scale.astype(np.float64), bo, 0), bi, 1)[:out_dim, :in_dim]
    return fp8_e4m3fn_encode(value / full), scale


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype string, numpy array in the stored representation)}."""
    header = {}
    offset = 0
    blobs = []
    for name, (dtype, arr) in tensors.items():
        np_dtype, size = _ST_DTYPES[dtype]
        data = np.ascontiguousarray(arr, dtype=np.dtype(np_dtype).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def write_model(model_dir, config, tensors, dtype="bf16", block_size=None, shards=1, omit=(),
                generation_config=None):
    """Write a Hugging Face checkpoint directory.

    dtype: "bf16", "f32", "f64" or "fp8" (fp8: every 2-D linear weight but embeddings, lm_head
      and the router becomes F8_E4M3 with a float32 weight_scale_inv per block; the rest is
      BF16).
      e_score_correction_bias is always F32, as DeepSeek ships it.
    block_size: the FP8 blocks actually written; defaults to the config's
      quantization_config.weight_block_size, else [128, 128] (which is then written to the
      config). A value different from the config's makes a hostile checkpoint.
    shards: > 1 writes model-0000k-of-0000n.safetensors files and model.safetensors.index.json.
    omit: tensor names (after quantisation, e.g. "X.weight_scale_inv") left out of the files.
    Returns {name: float64 values as the reader will see them}.
    """
    os.makedirs(model_dir, exist_ok=True)
    config = json.loads(json.dumps(config))
    if dtype == "fp8":
        qc = config.setdefault("quantization_config", {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]})
        blocks = tuple(block_size or qc.get("weight_block_size") or (128, 128))
    elif dtype not in ("bf16", "f32", "f64"):
        raise ValueError(f"dtype {dtype!r}: bf16, f32, f64 or fp8")
    config.setdefault("torch_dtype", {"f32": "float32", "f64": "float64"}.get(dtype, "bfloat16"))
    stored = {}
    seen = {}
    for name, value in tensors.items():
        value = np.asarray(value, dtype=np.float64)
        if dtype == "f64":
            stored[name] = ("F64", value)
            seen[name] = value
        elif name.endswith("e_score_correction_bias") or dtype == "f32":
            stored[name] = ("F32", value.astype(np.float32))
            seen[name] = value.astype(np.float32).astype(np.float64)
        elif dtype == "fp8" and _is_fp8_candidate(name, value):
            codes, scale = quantize_blocks(value, blocks)
            stored[name] = ("F8_E4M3", codes)
            stored[name + "_scale_inv"] = ("F32", scale)
            full = np.repeat(np.repeat(scale.astype(np.float64), blocks[0], 0), blocks[1], 1)
            seen[name] = FP8_E4M3FN[codes] * full[:value.shape[0], :value.shape[1]]
        else:
            bits = bf16_encode(value)
            stored[name] = ("BF16", bits)
            seen[name] = bf16_decode(bits)
    for name in omit:
        stored.pop(name)
        seen.pop(name, None)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    gen = generation_config if generation_config is not None else {
        k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    for old in os.listdir(model_dir):
        if old.endswith(".safetensors") or old == "model.safetensors.index.json":
            os.remove(os.path.join(model_dir, old))
    names = list(stored)
    if shards <= 1:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), stored,
                          {"format": "pt"})
    else:
        weight_map = {}
        per = -(-len(names) // shards)
        for k in range(shards):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: stored[n] for n in names[k * per:(k + 1) * per]}
            write_safetensors(os.path.join(model_dir, fname), part, {"format": "pt"})
            for n in part:
                weight_map[n] = fname
        with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    return seen


def random_tensors(config, seed=0, std=0.08, extra_layers=0):
    """Seeded random weights for every tensor the config implies (norm weights around 1). With
    extra_layers, also an MTP-like layer's tensors at index num_hidden_layers and above (which
    the forward pass must ignore)."""
    rng = np.random.default_rng(seed)
    shapes = dict(tensor_shapes(config))
    if extra_layers:
        cfg = dict(config)
        cfg["num_hidden_layers"] = config["num_hidden_layers"] + extra_layers
        for name, shape in tensor_shapes(cfg).items():
            if name.startswith("model.layers.") and \
                    int(name.split(".")[2]) >= config["num_hidden_layers"]:
                shapes[name] = shape
        n = config["num_hidden_layers"]
        D = config["hidden_size"]
        shapes[f"model.layers.{n}.enorm.weight"] = (D,)
        shapes[f"model.layers.{n}.hnorm.weight"] = (D,)
        shapes[f"model.layers.{n}.eh_proj.weight"] = (D, 2 * D)
        shapes[f"model.layers.{n}.shared_head.norm.weight"] = (D,)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and ("norm" in name):
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("e_score_correction_bias"):
            out[name] = 0.05 * rng.standard_normal(shape)
        elif len(shape) == 1:
            out[name] = 0.02 * rng.standard_normal(shape)
        else:
            out[name] = std * rng.standard_normal(shape)
    return out


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def _parse_ids(text):
    text = text.strip()
    if text.startswith("["):
        ids = json.loads(text)
    else:
        ids = [int(t) for t in text.split(",") if t.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("empty prompt")
    return [int(t) for t in ids]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--prompt-ids", action="append", type=_parse_ids, required=True,
                    help="comma-separated (or JSON) token ids; repeat for more prompts")
    ap.add_argument("--tokens", type=int, default=24, help="greedy tokens to generate")
    ap.add_argument("--top", type=int, default=20, help="top logprobs per step")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    args = ap.parse_args(argv)
    try:
        result = run(args.model, args.prompt_ids, args.tokens, args.top)
    except CheckpointError as e:
        print(f"hf_reference: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
