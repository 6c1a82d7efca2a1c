"""Build a case's model and inputs on CPU (seed 0, small sizes, no dropout)."""

import os

import tvshim  # noqa: F401
import torch
import torch.nn as nn

LIMIT = 30_000_000
SIZES = {
    (
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_encoder_layers",
        "num_decoder_layers",
    ): 2,
    ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "n_embed"): 64,
    ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads", "num_heads"): 4,
    ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"): 2,
    ("head_dim", "attention_head_dim", "d_kv", "kv_channels"): 16,
    (
        "intermediate_size",
        "ffn_dim",
        "n_inner",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "d_ff",
        "ffn_hidden_size",
        "hidden_ffn_dim",
        "hidden_dim",
    ): 128,
    ("vocab_size",): 512,
    ("image_size", "img_size"): 32,
    ("patch_size",): 8,
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"): 4,
    ("num_experts_per_tok", "moe_k", "top_k", "num_experts_per_token"): 2,
    ("moe_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size"): 64,
    ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"): 8,
    ("q_lora_rank", "kv_lora_rank"): 32,
    ("rotary_dim",): 16,
    ("max_position_embeddings", "n_positions"): 128,
}
SUBCONFIGS = ("text_config", "vision_config", "audio_config", "encoder_config", "decoder_config")
TOKEN_KEYS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
    "cls_token_id",
    "mask_token_id",
    "unk_token_id",
)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _zero_dropout_cfg(cfg):
    for k, v in list(vars(cfg).items()):
        lk = k.lower()
        if isinstance(v, float) and (
            "dropout" in lk
            or "drop_path" in lk
            or "droppath" in lk
            or "pdrop" in lk
            or "stochastic_depth" in lk
            or lk.endswith("_drop")
            or "layerdrop" in lk
            or "drop_rate" in lk
        ):
            setattr(cfg, k, 0.0)


def _shrink(cfg, shorten_layer_types=True, experts=True):
    for keys, val in SIZES.items():
        if not experts and any("expert" in k or k in ("moe_k", "top_k") for k in keys):
            continue
        for k in keys:
            if _is_int(getattr(cfg, k, None)):
                setattr(cfg, k, val)
    for k in ("image_size", "img_size"):
        v = getattr(cfg, k, None)
        if isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v):
            setattr(cfg, k, type(v)([32, 32]))
    vocab = getattr(cfg, "vocab_size", None)
    if _is_int(vocab):
        for k in TOKEN_KEYS:
            v = getattr(cfg, k, None)
            if _is_int(v) and v >= vocab:
                setattr(cfg, k, 0)
            elif isinstance(v, list):
                setattr(cfg, k, [0 if _is_int(x) and x >= vocab else x for x in v])
    if (
        hasattr(cfg, "num_key_value_heads")
        and getattr(cfg, "num_key_value_heads") is None
        and _is_int(getattr(cfg, "num_attention_heads", None))
    ):
        cfg.num_key_value_heads = 2  # nemotron derives its key heads from this key
    if _is_int(getattr(cfg, "qk_rope_head_dim", None)) and _is_int(getattr(cfg, "head_dim", None)):
        try:
            cfg.head_dim = cfg.qk_rope_head_dim  # MLA configs rotate head_dim = the rope part
        except AttributeError:
            pass
    if getattr(cfg, "kv_lora_rank", None) is not None and _is_int(getattr(cfg, "num_key_value_heads", None)):
        cfg.num_key_value_heads = cfg.num_attention_heads  # MLA: keys per query head
    hidden = getattr(cfg, "hidden_size", None)
    if _is_int(getattr(cfg, "mamba_n_heads", None)) and _is_int(getattr(cfg, "mamba_d_head", None)):
        cfg.mamba_d_head = 16  # heads x head dim = expand x hidden
        cfg.mamba_n_heads = int(getattr(cfg, "mamba_expand", 2) * hidden) // 16
    elif cfg.model_type == "mamba2" and _is_int(hidden):
        cfg.head_dim = int(cfg.expand * hidden) // cfg.num_heads
    lt = getattr(cfg, "layer_types", None)
    if shorten_layer_types and isinstance(lt, list) and len(lt) > 2:
        cfg.layer_types = lt[:2]
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    _zero_dropout_cfg(cfg)


def hf_config(name, shorten_layer_types=True, experts=True):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(name)
    _shrink(cfg, shorten_layer_types, experts)
    if os.environ.get("SWEEP_SUBCONFIGS") == "1":
        for s in SUBCONFIGS:
            sub = getattr(cfg, s, None)
            if sub is not None and hasattr(sub, "to_dict"):
                _shrink(sub, shorten_layer_types, experts)
    return cfg


def _hf_model(cfg):
    from transformers import AutoModel

    try:
        return AutoModel.from_config(cfg, attn_implementation="sdpa")
    except (ValueError, ImportError, TypeError):
        return AutoModel.from_config(cfg, attn_implementation="eager")


def count_meta(fn):
    try:
        with torch.device("meta"):
            m = fn()
        return sum(p.numel() for p in m.parameters())
    except Exception:
        return None


ATTEMPTS = ((True, True), (False, True), (False, False))  # (cut layer_types, small experts)
last_attempt = 0


def hf_build(name, first=0):
    """(model, inputs, params) or raises; params > LIMIT means skipped (model None)."""
    global last_attempt
    last = None
    for i, attempt in enumerate(ATTEMPTS[first:], first):
        last_attempt = i
        try:
            cfg = hf_config(name, *attempt)
            n = count_meta(lambda: _hf_model(cfg))
            if n is not None and n > LIMIT:
                return None, None, n
            torch.manual_seed(0)
            model = _hf_model(cfg)
            n = sum(p.numel() for p in model.parameters())
            if n > LIMIT:
                return None, None, n
            inputs = hf_inputs(model, cfg)
            return model, inputs, n
        except MemoryError:
            raise
        except Exception as e:  # retry without the layer_types cut / small experts
            last = e
    raise last


def hf_inputs(model, cfg):
    g = torch.Generator().manual_seed(1)
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids":
        vocab = getattr(cfg, "vocab_size", None)
        if not _is_int(vocab):
            tc = getattr(cfg, "text_config", None)
            vocab = getattr(tc, "vocab_size", 512) if tc is not None else 512
        vocab = min(vocab, 512)
        inp = {"input_ids": torch.randint(1, vocab, (2, 16), generator=g)}
        if getattr(cfg, "is_encoder_decoder", False):
            inp["decoder_input_ids"] = torch.randint(1, vocab, (2, 8), generator=g)
        return inp
    if main == "pixel_values":
        c = getattr(cfg, "num_channels", None)
        vc = getattr(cfg, "vision_config", None)
        if c is None and vc is not None:
            c = getattr(vc, "num_channels", 3)
        size = getattr(cfg, "image_size", None)
        if size is None and vc is not None:
            size = getattr(vc, "image_size", 32)
        if isinstance(size, (list, tuple)):
            h, w = size[-2], size[-1]
        elif isinstance(size, dict):
            h, w = size.get("height", 32), size.get("width", 32)
        else:
            h = w = size or 32
        return {"pixel_values": torch.randn(2, c or 3, h, w, generator=g)}
    raise RuntimeError(f"main input {main!r} is neither token ids nor pixels")


def timm_build(name):
    import timm

    took_size = [True]

    def make():
        # timm's defaults are drop_rate=0, drop_path_rate=0; not every model takes the keys.
        try:
            return timm.create_model(name, pretrained=False, num_classes=10, img_size=64)
        except TypeError:
            took_size[0] = False
            return timm.create_model(name, pretrained=False, num_classes=10)

    n = count_meta(make)
    if n is not None and n > LIMIT:
        return None, None, n
    torch.manual_seed(0)
    model = make()
    n = sum(p.numel() for p in model.parameters())
    if n > LIMIT:
        return None, None, n
    size = 64
    pc = getattr(model, "pretrained_cfg", {}) or {}
    if pc.get("fixed_input_size") and pc.get("input_size") and not took_size[0]:
        c, size_h, size_w = pc["input_size"]
    else:
        c, size_h, size_w = 3, size, size
    g = torch.Generator().manual_seed(1)
    return model, {"x": torch.randn(2, c, size_h, size_w, generator=g)}, n


def tv_build(name):
    import torchvision.models as tvm

    kw = {"num_classes": 10}
    if name == "inception_v3" or name == "googlenet":
        kw["aux_logits"] = False
        kw["init_weights"] = True
    n = count_meta(lambda: tvm.get_model(name, weights=None, **kw))
    if n is not None and n > LIMIT:
        return None, None, n
    torch.manual_seed(0)
    model = tvm.get_model(name, weights=None, **kw)
    n = sum(p.numel() for p in model.parameters())
    if n > LIMIT:
        return None, None, n
    s = 96 if name == "inception_v3" else 64
    g = torch.Generator().manual_seed(1)
    return model, {"x": torch.randn(2, 3, s, s, generator=g)}, n


def zero_dropout(model):
    """Dropout, drop path and stochastic depth to 0 on module attributes."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for k in (
            "drop_prob",
            "drop_path_prob",
            "p_drop",
            "dropout_p",
            "drop_rate",
            "attn_drop_rate",
            "proj_drop_rate",
            "drop_path_rate",
            "layerdrop",
            "dropout",
            "attention_dropout",
            "hidden_dropout",
            "activation_dropout",
            "drop_path",
        ):
            v = getattr(m, k, None)
            if isinstance(v, float) and not isinstance(v, bool):
                try:
                    setattr(m, k, 0.0)
                except Exception:
                    pass
        for k, v in list(vars(m).items()):  # e.g. gpt_bigcode's attn_pdrop, passed to SDPA
            lk = k.lower()
            if type(v) is float and ("dropout" in lk or "pdrop" in lk or "drop_prob" in lk):
                setattr(m, k, 0.0)
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0


def build(case, first=0):
    """(model, inputs, params); transformers configs from attempt `first` of ATTEMPTS on."""
    global last_attempt
    last_attempt = len(ATTEMPTS) - 1
    s, name = case["suite"], case["name"]
    if s == "transformers":
        model, inputs, n = hf_build(name, first)
    elif s == "timm":
        model, inputs, n = timm_build(name)
    else:
        model, inputs, n = tv_build(name)
    if model is not None:
        zero_dropout(model)
    return model, inputs, n
