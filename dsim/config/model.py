"""ModelSpec: the architecture facts a latency model needs, derived from a HuggingFace config.json.

Handles dense, GQA/MQA, MoE (Mixtral ``num_local_experts``, Qwen-MoE ``num_experts`` +
``moe_intermediate_size``, DeepSeek-style ``n_routed_experts`` + shared experts + leading dense
layers) and DeepSeek's multi-head latent attention (MLA).  FLOPs and bytes streamed per step
count matmul weights (FLOPs are 2 x multiply-accumulates); ``total_params`` also counts norms,
biases and learned position embeddings (``extra_params``) so it matches published counts.
Keys a config.json leaves out take HuggingFace's default for that model type (e.g. Llama-family
configs untie the LM head, the base PretrainedConfig ties it).

Quantized checkpoints (``quantization_config`` at the top level or in ``text_config``, read by
dsim.config.quant): ``bytes_per_param`` stays the checkpoint's 16-bit dtype (embeddings, norms,
activations, unquantized layers) and ``quant`` gives the bytes per weight of the quantized linear layers
and the dtype their GEMMs run in.  ``kv_cache_bytes`` is vLLM's ``--kv-cache-dtype`` (1 byte for fp8).
"""
from __future__ import annotations

import json
from importlib import resources
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from .errors import ConfigError
from .files import parse_json, read_text
from .quant import QuantSpec, find_quant_config, parse_quant

CATALOG_DIR = Path(str(resources.files("dsim.config").joinpath("catalog")))   # package data

# Public model ids -> catalogue file names; the file stem is accepted too.
ALIASES = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b-instruct",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b-instruct",
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b-instruct",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b-instruct",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b-hf",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b-hf",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b-v0.1",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b-v0.1",
    "mistralai/Mistral-Nemo-Instruct-2407": "mistral-nemo-instruct-2407",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
    "deepseek-ai/DeepSeek-V2-Lite": "deepseek-v2-lite",
    "01-ai/Yi-34B": "yi-34b",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b-instruct-hf",
    "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic": "llama-4-scout-17b-16e-instruct-fp8-dynamic",
}

# model types whose HuggingFace config class defaults tie_word_embeddings to False (the base
# PretrainedConfig, and so OPT, GPT-2, Falcon, Gemma, default to True)
_UNTIED_BY_DEFAULT = {"llama", "llama4", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                      "qwen3_moe", "deepseek_v2", "deepseek_v3", "phi3", "gpt_neox", "glm4", "glm4_moe",
                      "glm_moe_dsa"}
# model types with LayerNorm (weight + bias) instead of RMSNorm (weight only)
_LAYERNORM = {"opt", "gpt2", "falcon", "gpt_neox", "gpt_bigcode", "phi"}
_LEARNED_POSITIONS = {"opt": 2, "gpt2": 0, "gpt_bigcode": 0}   # model type -> position offset

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1, "int8": 1}
# vLLM --kv-cache-dtype -> bytes per KV element (0: the model's dtype)
KV_CACHE_DTYPES = {"auto": 0, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def catalog_stem(name: str) -> str | None:
    """The catalogue file for a HuggingFace name, case-insensitively; a base model resolves to its
    instruct variant's config (same architecture: only the weights differ)."""
    aliases = {k.lower(): v for k, v in ALIASES.items()}
    stems = {s.lower(): s for s in catalog_names()}
    key = name.strip().lower()
    for cand in (key, key.split("/")[-1]):
        for c in (cand, cand + "-instruct"):
            if c in aliases:
                return aliases[c]
            if c in stems:
                return stems[c]
    return None


def catalog_names() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: int = 2
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    # MoE (num_experts == 0 means dense)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0          # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    # MLA (kv_lora_rank == 0 means standard attention)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    extra_params: int = 0              # norms, biases, learned position embeddings (not matmuls)
    quant: QuantSpec | None = None     # quantized linear layers (None: every weight is bytes_per_param)
    kv_cache_bytes: int = 0            # bytes per KV element; 0 = the model dtype (kv_cache_dtype auto)
    source: str = field(default="", compare=False)

    # ---- validity (seed 004, BC-1) -------------------------------------------------------
    def validate(self, path: str = "model") -> "ModelSpec":
        for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, k) <= 0:
                raise ConfigError(f"{path}.{k}", getattr(self, k), "a positive integer")
        if self.num_kv_heads > self.num_heads:
            raise ConfigError(f"{path}.num_key_value_heads", self.num_kv_heads,
                              f"<= num_attention_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{path}.num_key_value_heads", self.num_kv_heads,
                              f"a divisor of num_attention_heads ({self.num_heads})")
        if self.bytes_per_param not in (1, 2, 4):
            raise ConfigError(f"{path}.torch_dtype", self.bytes_per_param, "1, 2 or 4 bytes per parameter")
        if self.is_moe:
            if self.num_experts < 2:
                raise ConfigError(f"{path}.num_experts", self.num_experts, "> 1 for a MoE model")
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ConfigError(f"{path}.num_experts_per_tok", self.experts_per_token,
                                  f"between 1 and num_experts ({self.num_experts})")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- quantization and KV dtype --------------------------------------------------------
    @property
    def compute_dtype(self) -> str:
        """Input dtype of the quantized GEMMs: fp8 / int8 (W8A8), fp4 or bf16 (weight-only, unquantized)."""
        return self.quant.compute_dtype if self.quant else "bf16"

    def _part_bytes(self, share: float) -> float:
        q = self.quant
        return self.bytes_per_param if q is None else share * q.weight_bytes + (1 - share) * self.bytes_per_param

    @property
    def attn_bytes_per_param(self) -> float:
        return self._part_bytes(self.quant.attn_share if self.quant else 0.0)

    @property
    def mlp_bytes_per_param(self) -> float:
        """Bytes per MLP / expert weight (the MoE router is counted with them)."""
        return self._part_bytes(self.quant.mlp_share if self.quant else 0.0)

    @property
    def lm_head_bytes_per_param(self) -> float:
        q = self.quant
        return q.weight_bytes if q and q.lm_head and not self.tie_word_embeddings else self.bytes_per_param

    @property
    def lm_head_bytes(self) -> float:
        return self.lm_head_params * self.lm_head_bytes_per_param

    @cached_property
    def compute_dtype_share(self) -> float:
        """Share of the linear FLOPs per token (LM head included) that run in ``compute_dtype``."""
        q = self.quant
        if q is None:
            return 0.0
        quantized = (self.num_layers * self.attn_params_per_layer * q.attn_share
                     + self.mlp_params_active * q.mlp_share + (self.lm_head_params if q.lm_head else 0))
        return quantized / (self.active_params or 1)

    @property
    def kv_bytes_per_element(self) -> int:
        return self.kv_cache_bytes or self.bytes_per_param

    def with_kv_cache_dtype(self, dtype: str, path: str = "engine.kv_cache_dtype") -> "ModelSpec":
        """This model with vLLM's ``--kv-cache-dtype`` applied (``auto``: the model dtype)."""
        if dtype not in KV_CACHE_DTYPES:
            raise ConfigError(path, dtype, "one of " + ", ".join(KV_CACHE_DTYPES))
        b = KV_CACHE_DTYPES[dtype]
        return self if b == self.kv_cache_bytes else replace(self, kv_cache_bytes=b)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---- per-layer parameter counts -------------------------------------------------------
    @cached_property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
            else:
                q = h * self.num_heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv_a + kv_b + o
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def _mlp(self, inter: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * inter

    @cached_property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def _mlp_params(self, experts: int) -> int:
        """MLP weights over all layers when ``experts`` routed experts per MoE layer are counted."""
        dense = (self.num_layers - self.num_moe_layers) * self._mlp(self.intermediate_size)
        if not self.is_moe:
            return dense
        per = (experts * self._mlp(self.expert_intermediate_size)
               + (self._mlp(self.shared_expert_intermediate_size) if self.num_shared_experts else 0)
               + self.hidden_size * self.num_experts)  # router
        return dense + self.num_moe_layers * per

    @cached_property
    def mlp_params_total(self) -> int:
        return self._mlp_params(self.num_experts)

    @cached_property
    def mlp_params_active(self) -> int:
        return self._mlp_params(self.experts_per_token)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.attn_params_per_layer + self.mlp_params_total + emb + self.extra_params

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token (matmul weights incl. LM head; not the embedding gather)."""
        return self.num_layers * self.attn_params_per_layer + self.mlp_params_active + self.lm_head_params

    # ---- derived per-token costs ----------------------------------------------------------
    @cached_property
    def flops_per_token_linear(self) -> int:
        """Linear-layer FLOPs for one token through all layers, without the LM head."""
        return 2 * (self.num_layers * self.attn_params_per_layer + self.mlp_params_active)

    @property
    def flops_lm_head(self) -> int:
        return 2 * self.lm_head_params

    @property
    def flops_per_token(self) -> int:
        """Linear FLOPs per token including the LM head (the seed-000 ``flops_linear_per_token``)."""
        return self.flops_per_token_linear + self.flops_lm_head

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of QK^T plus PV for one (query, key) pair over all layers."""
        if self.is_mla:
            return 2 * self.num_layers * self.num_heads * (
                self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4 * self.num_layers * self.q_dim

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes of weights resident on the GPUs (all experts, embedding and LM head); quantized
        linear layers at their bytes per weight, the rest at ``bytes_per_param``."""
        if self.quant is None:
            return self.total_params * self.bytes_per_param
        head = 0 if self.tie_word_embeddings else self.lm_head_bytes
        return int(round(self.num_layers * self.attn_params_per_layer * self.attn_bytes_per_param
                         + self.mlp_params_total * self.mlp_bytes_per_param + head
                         + (self.embedding_params + self.extra_params) * self.bytes_per_param))

    def layer_weight_bytes(self, experts: float | None = None) -> float:
        """Bytes of the transformer layers' matmul weights (no embedding, no LM head) when
        ``experts`` routed experts per MoE layer are read (default: all of them)."""
        e = self.num_experts if experts is None else experts
        if self.quant is None:
            return (self.num_layers * self.attn_params_per_layer + self._mlp_params(e)) * self.bytes_per_param
        return (self.num_layers * self.attn_params_per_layer * self.attn_bytes_per_param
                + self._mlp_params(e) * self.mlp_bytes_per_param)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert summed over all MoE layers (0 for a dense model)."""
        return self._mlp(self.expert_intermediate_size) * self.num_moe_layers * self.mlp_bytes_per_param \
            if self.is_moe else 0

    def kv_shards(self, tp: int) -> int:
        """GPUs a token's KV is split over: KV heads shard up to TP; an MLA latent is replicated."""
        return 1 if self.is_mla else max(1, min(tp, self.num_kv_heads))

    @cached_property
    def kv_bytes_per_token(self) -> int:
        if self.is_mla:  # compressed latent + decoupled rope key, one per layer
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes_per_element
        return 2 * self.num_layers * self.kv_dim * self.kv_bytes_per_element


def _get(cfg: dict, *keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _int(cfg: dict, path: str, *keys, default=None, lo: int = 1) -> int:
    """The first of ``keys`` the config sets, as an integer >= ``lo``: '4096', 4096.5 or true are
    errors naming the key (int() turned '4096' into a size and true into 1; 4096.5 lost its half)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        return default
    v = cfg[key]
    ok = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if isinstance(v, bool) or not ok or v < lo:
        raise ConfigError(f"{path}.{key}", v, f"an integer >= {lo}")
    return int(v)


def model_from_hf(cfg: dict, name: str = "", path: str = "model", source: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed HuggingFace config.json (multimodal: its text_config)."""
    if not isinstance(cfg, dict):
        raise ConfigError(path, cfg, "a config.json mapping")
    q_raw, q_path = find_quant_config(cfg, path)
    if isinstance(cfg.get("text_config"), dict):
        outer_dtype = cfg.get("torch_dtype")
        cfg = dict(cfg["text_config"])
        cfg.setdefault("torch_dtype", outer_dtype)
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if cfg.get(k) is None:
            raise ConfigError(f"{path}.{k}", None, "this key in config.json", show_value=False)
    hidden = _int(cfg, path, "hidden_size")
    layers = _int(cfg, path, "num_hidden_layers")
    heads = _int(cfg, path, "num_attention_heads")
    kv_heads = _int(cfg, path, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, path, "head_dim", default=hidden // heads)
    dtype = str(_get(cfg, "torch_dtype", "dtype", default="bfloat16"))
    bpp = _DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    quant = parse_quant(q_raw, q_path, layers) if q_raw is not None else None
    n_exp = _int(cfg, path, "num_local_experts", "num_experts", "n_routed_experts", default=0, lo=0)
    top_k = _int(cfg, path, "num_experts_per_tok", "num_experts_per_token", default=0, lo=0)
    if top_k > max(n_exp, 1):
        key = next(k for k in ("num_experts_per_tok", "num_experts_per_token") if cfg.get(k) is not None)
        raise ConfigError(f"{path}.{key}", top_k, f"at most the number of experts ({n_exp})")
    if n_exp <= 1:
        n_exp = 0
    top_k = top_k if n_exp else 0
    inter = _int(cfg, path, "intermediate_size_mlp", "intermediate_size", "ffn_dim", default=4 * hidden)
    exp_inter = _int(cfg, path, "moe_intermediate_size", "intermediate_size", default=inter) if n_exp else 0
    n_shared = _int(cfg, path, "n_shared_experts", default=0, lo=0)
    shared_inter = 0
    if n_shared:
        shared_inter = n_shared * exp_inter
    elif str(cfg.get("model_type", "")).startswith("llama4") and n_exp:
        n_shared, shared_inter = 1, exp_inter          # Llama 4: one shared expert per MoE layer
    elif _get(cfg, "shared_expert_intermediate_size"):
        n_shared, shared_inter = 1, _int(cfg, path, "shared_expert_intermediate_size")
    dense_layers = _int(cfg, path, "first_k_dense_replace", default=0, lo=0) if n_exp else 0
    act = str(_get(cfg, "hidden_act", "activation_function", default="silu"))
    gated = act in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu") or "llama" in str(cfg.get("model_type", ""))
    if str(cfg.get("model_type", "")) in ("gpt2", "opt", "gpt_bigcode", "falcon"):
        gated = False
    mla = _int(cfg, path, "kv_lora_rank", default=0, lo=0)
    mtype = str(cfg.get("model_type", ""))
    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = mtype not in _UNTIED_BY_DEFAULT
    norm = (2 if mtype in _LAYERNORM else 1) * hidden * (2 * layers + 1)
    extra = norm
    if mtype in _LEARNED_POSITIONS:
        extra += (_int(cfg, path, "max_position_embeddings", "n_positions", default=2048)
                  + _LEARNED_POSITIONS[mtype]) * hidden
    if mtype.startswith("qwen3"):                    # per-head RMSNorm on queries and keys
        extra += layers * 2 * head_dim
    if mla:                                          # RMSNorm on the compressed KV (and Q) latents
        extra += layers * (mla + _int(cfg, path, "q_lora_rank", default=0, lo=0))
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    if bool(_get(cfg, "enable_bias", "bias", default=mtype in ("opt", "gpt2"))):    # every linear layer
        extra += layers * (q_dim + 2 * kv_dim + hidden + (0 if gated else inter + hidden))
    elif bool(_get(cfg, "attention_bias", default=mtype == "qwen2")):               # q, k, v only
        extra += layers * (q_dim + 2 * kv_dim)
    spec = ModelSpec(
        name=name or str(cfg.get("_name_or_path", "custom")),
        num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=inter, vocab_size=_int(cfg, path, "vocab_size", default=32000),
        bytes_per_param=bpp, tie_word_embeddings=bool(tie),
        gated_mlp=gated, num_experts=n_exp, experts_per_token=top_k, expert_intermediate_size=exp_inter,
        num_shared_experts=n_shared, shared_expert_intermediate_size=shared_inter,
        num_dense_layers=dense_layers, kv_lora_rank=mla,
        q_lora_rank=_int(cfg, path, "q_lora_rank", default=0, lo=0) if mla else 0,
        qk_rope_head_dim=_int(cfg, path, "qk_rope_head_dim", default=0, lo=0) if mla else 0,
        qk_nope_head_dim=_int(cfg, path, "qk_nope_head_dim", default=0, lo=0) if mla else 0,
        v_head_dim=_int(cfg, path, "v_head_dim", default=0, lo=0) if mla else 0,
        extra_params=extra, quant=quant, source=source,
    )
    return spec.validate(path)


def load_model(value, path: str = "model", base_dir: Path | None = None) -> ModelSpec:
    """Resolve the scenario's ``model``: a catalogue name, or a ModelSection (a mapping is parsed into
    one) naming a HuggingFace config.json, relative to ``base_dir``."""
    if isinstance(value, str):
        stem = catalog_stem(value)
        if stem is None:
            import difflib
            names = sorted(ALIASES)
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(path, value, "a catalogue model (" + ", ".join(names)
                              + ") or {config: path/to/config.json}" + hint)
        f = CATALOG_DIR / f"{stem}.json"
        return model_from_hf(json.loads(f.read_text()), name=value, path=path, source=f"catalog:{f.stem}")
    from .schema.base import parse
    from .schema.model import ModelSection
    if isinstance(value, dict):
        value = parse(ModelSection, value, path)
    if not isinstance(value, ModelSection):
        raise ConfigError(path, value, "a catalogue model name or {config: path/to/config.json}")
    p = Path(value.config)
    if base_dir is not None and not p.is_absolute():
        p = base_dir / p
    if not p.exists():
        raise ConfigError(f"{path}.config", value.config, "an existing config.json file")
    cfg = parse_json(read_text(p), str(p))
    # errors in the file name the file and its key (p.hidden_size), not only the scenario key
    return model_from_hf(cfg, name=value.name if value.name is not None else p.parent.name, path=str(p),
                         source=str(p))
