"""Quantized checkpoints: what a HuggingFace ``quantization_config`` means for memory and compute.

A checkpoint's ``quantization_config`` sits at the top of config.json, or, for a multimodal model, at the
top next to ``text_config`` or inside it; :func:`find_quant_config` looks in all of these (and the older
compressed-tensors key ``compression_config``).  :func:`parse_quant` reads the common forms vLLM loads:

- ``fp8`` (vLLM Fp8Config, per-tensor or ``weight_block_size`` scales), ``fbgemm_fp8``, ``modelopt``
  (``quant_algo: FP8`` / ``NVFP4``): FP8 weights and activations (W8A8);
- ``compressed-tensors`` (llm-compressor): ``config_groups`` give the weight ``num_bits``/``type``/
  ``group_size`` and the ``input_activations`` (none: weight-only); ``format: float-quantized`` is FP8,
  ``int-quantized`` W8A8 int8, ``pack-quantized`` W4A16/W8A16;
- ``gptq``/``awq`` (``bits``, ``group_size``, zero points), ``bitsandbytes`` (4 or 8 bit), ``mxfp4``:
  weight-only, the GEMMs run in BF16 after dequantization.

Ignore lists (``ignore``, ``ignored_layers``, ``modules_to_not_convert``, ``exclude_modules``,
``llm_int8_skip_modules``) are read per linear group: the share of layers whose attention projections
or MLP/experts are left unquantized, and the LM head.  The LM head is unquantized unless a GPTQ config
says ``lm_head: true`` (vLLM keeps ``ParallelLMHead`` in the model dtype otherwise); embeddings and
norms are never quantized; vision towers are not modelled.  Group scales count in the bytes per weight
(e.g. GPTQ 4-bit with group 128: 0.5 + 2/128 bytes).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

METHODS = ("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors", "gptq", "gptq_marlin", "awq", "awq_marlin",
           "bitsandbytes", "mxfp4")
COMPUTE_DTYPES = ("bf16", "fp8", "int8", "fp4")
IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert", "exclude_modules", "llm_int8_skip_modules")

_SKIP = ("vision", "visual", "multi_modal", "mm_projector", "audio", "image")
_ATTN = ("self_attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv", "attn")
_MLP = ("mlp", "feed_forward", "experts", "expert", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
        "fc1", "fc2", "ffn")
_LAYER = re.compile(r"(?:layers|h|blocks)\.(\d+)\.")


@dataclass(frozen=True)
class QuantSpec:
    method: str                  # quant_method as written (fp8, compressed-tensors, gptq, ...)
    scheme: str                  # e.g. w8a8-fp8, w4a16-int
    weight_bytes: float          # bytes per quantized weight, scales included
    compute_dtype: str           # GEMM input dtype: fp8 / int8 / fp4 (W8A8, W4A4) or bf16 (weight-only)
    attn_share: float = 1.0      # share of layers whose attention projections are quantized
    mlp_share: float = 1.0       # share of layers whose MLP / experts are quantized
    lm_head: bool = False        # the LM head is quantized too


def find_quant_config(cfg: dict, path: str):
    """The checkpoint's quantization config and its path, or (None, path): the top level first, then
    ``text_config`` (multimodal checkpoints quantized by llm-compressor put it at the top)."""
    places = [(cfg, path)]
    if isinstance(cfg.get("text_config"), dict):
        places.append((cfg["text_config"], f"{path}.text_config"))
    for where, p in places:
        for key in ("quantization_config", "compression_config"):
            if where.get(key) is not None:
                return where[key], f"{p}.{key}"
    return None, path


def _num(d: dict, key: str, path: str, default=None, choices=None):
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (choices and v not in choices):
        raise ConfigError(f"{path}.{key}", v, "one of " + ", ".join(map(str, choices)) if choices else "a number")
    return v


def _ignored(entries, num_layers: int, path: str) -> tuple[float, float]:
    """Shares of layers whose attention / MLP are left unquantized by an ignore list (a ``re:``
    pattern or a name without a layer index counts for every layer)."""
    if entries is None:
        return 0.0, 0.0
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ConfigError(path, entries, "a list of module names")
    layers = {"attn": set(), "mlp": set()}
    everywhere = {"attn": False, "mlp": False}
    for e in entries:
        low = e.lower()
        if any(s in low for s in _SKIP):
            continue
        if "lm_head" in low or "output_layer" in low:
            continue
        last = low.rsplit(".", 1)[-1]
        if last in ("router", "gate"):                  # a MoE router: tiny, sized with the MLP
            continue
        part = "attn" if any(s in low for s in _ATTN) else "mlp" if any(s in low for s in _MLP) else None
        if part is None:
            continue
        m = _LAYER.search(low)
        if m is None or low.startswith("re:"):
            everywhere[part] = True
        else:
            layers[part].add(int(m.group(1)))
    share = {p: 1.0 if everywhere[p] else min(1.0, len(layers[p]) / max(1, num_layers)) for p in layers}
    return share["attn"], share["mlp"]


def parse_quant(q, path: str, num_layers: int) -> QuantSpec:
    """A QuantSpec from a ``quantization_config`` mapping (see the module docstring)."""
    if not isinstance(q, dict):
        raise ConfigError(path, q, "a quantization_config mapping")
    method = q.get("quant_method")
    if method is None:
        raise ConfigError(f"{path}.quant_method", None, "the checkpoint's quant_method", show_value=False)
    method = str(method).lower()
    if method not in METHODS:
        raise ConfigError(f"{path}.quant_method", q.get("quant_method"),
                          "a quantization dsim models (" + ", ".join(METHODS) + ")")
    ign_key = next((k for k in IGNORE_KEYS if q.get(k) is not None), None)
    entries = q.get(ign_key) if ign_key else None
    attn_off, mlp_off = _ignored(entries, num_layers, f"{path}.{ign_key}")
    lm_head = False
    if method in ("fp8", "fbgemm_fp8"):
        scheme, wb, dtype = "w8a8-fp8", 1.0, "fp8"
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo == "FP8":
            scheme, wb, dtype = "w8a8-fp8", 1.0, "fp8"
        elif algo == "NVFP4":
            scheme, wb, dtype = "w4a4-nvfp4", 0.5 + 1 / 16, "fp4"     # an FP8 scale per 16 weights
        else:
            raise ConfigError(f"{path}.quant_algo", q.get("quant_algo"), "FP8 or NVFP4")
    elif method == "compressed-tensors":
        scheme, wb, dtype = _compressed_tensors(q, path)
    elif method in ("gptq", "gptq_marlin", "awq", "awq_marlin"):
        bits = _num(q, "bits" if "bits" in q else "w_bit", path, choices=(2, 3, 4, 8))
        group = _num(q, "group_size" if "group_size" in q else "q_group_size", path, default=-1)
        zeros = (not q.get("sym", True)) if method.startswith("gptq") else bool(q.get("zero_point", True))
        wb = bits / 8 + ((2 + (bits / 8 if zeros else 0)) / group if group and group > 0 else 0)
        scheme, dtype = f"w{bits}a16-int", "bf16"
        lm_head = method.startswith("gptq") and bool(q.get("lm_head", False))
    elif method == "bitsandbytes":
        if q.get("load_in_4bit"):
            scheme, wb = "w4a16-nf4", 0.5 + 4 / 64            # an FP32 absmax per block of 64
        elif q.get("load_in_8bit"):
            scheme, wb = "w8a16-int8", 1.0
        else:
            raise ConfigError(f"{path}.load_in_4bit", None, "load_in_4bit or load_in_8bit true", show_value=False)
        dtype = "bf16"
    else:   # mxfp4: 4-bit E2M1 weights, an 8-bit E8M0 scale per 32
        scheme, wb, dtype = "w4a16-mxfp4", 0.5 + 1 / 32, "bf16"
    return QuantSpec(method=method, scheme=scheme, weight_bytes=wb, compute_dtype=dtype,
                     attn_share=1.0 - attn_off, mlp_share=1.0 - mlp_off,
                     lm_head=lm_head and not any("lm_head" in e.lower() for e in entries or []))


def _compressed_tensors(q: dict, path: str) -> tuple[str, float, str]:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{path}.config_groups", groups, "a mapping of quantization groups (llm-compressor's "
                          "config_groups with weights num_bits/type)")
    # the group that targets Linear layers, else the first one
    name = next((k for k, g in groups.items() if isinstance(g, dict) and "Linear" in (g.get("targets") or [])),
                next(iter(groups)))
    g, gp = groups[name], f"{path}.config_groups.{name}"
    w = g.get("weights") if isinstance(g, dict) else None
    if not isinstance(w, dict):
        raise ConfigError(f"{gp}.weights", w, "the weights' quantization args (num_bits, type)")
    bits = _num(w, "num_bits", f"{gp}.weights", choices=(4, 8))
    kind = str(w.get("type", "int"))
    if kind not in ("int", "float"):
        raise ConfigError(f"{gp}.weights.type", kind, "int or float")
    group = w.get("group_size")
    if not isinstance(group, (int, type(None))) or isinstance(group, bool):
        raise ConfigError(f"{gp}.weights.group_size", group, "an integer or null")
    scale = 1 if (kind == "float" and bits == 4) else 2          # NVFP4 keeps FP8 scales, the rest 16-bit
    wb = bits / 8 + (scale / group if group and group > 0 else 0)
    label = {("float", 8): "fp8", ("float", 4): "fp4"}.get((kind, bits), "int")
    a = g.get("input_activations")
    if a is None:
        return f"w{bits}a16-{label}", wb, "bf16"
    if not isinstance(a, dict):
        raise ConfigError(f"{gp}.input_activations", a, "the activations' quantization args or null")
    abits = _num(a, "num_bits", f"{gp}.input_activations", choices=(4, 8, 16))
    akind = str(a.get("type", "int"))
    dtype = {(8, "float"): "fp8", (8, "int"): "int8", (4, "float"): "fp4"}.get((abits, akind), "bf16")
    return f"w{bits}a{abits}-{label}", wb, dtype
