"""flashlab attention in Hugging Face transformers models.

    from flashlab.integrations.transformers import attach, register
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=register())
    # or, for a model already built (checked first, see below): attach(model)

Only models whose attention layers call transformers' ``AttentionInterface`` can use a registered
function; transformers marks them ``_supports_attention_backend``. Others take the name without
using it: BERT on transformers 4.56 fails deep inside with a bare ``KeyError: 'lab_attention'``,
DeBERTa on 5.x silently keeps its own attention. flashlab cannot see which model a name will be
given to in ``from_pretrained``, so `attach` (a built model) and ``register(model=...)`` (a model
or its class) check first and refuse such a model in one line; `supports` answers the question.

`register` adds two entries under one name (``"lab_attention"``): the attention function to
transformers' ``AttentionInterface`` and its mask function to ``AttentionMaskInterface``.
Both are needed: without a registered mask function, a model hands a custom attention
``attention_mask=None`` and padded batches silently attend to their padding. The name must
not contain "flash": transformers reads such names as a hub flash-attention kernel.

The attention function is transformers' SDPA path with `flashlab.attention` in place of
``torch.nn.functional.scaled_dot_product_attention``: the same masks (boolean, True = attend,
from transformers' own `sdpa_mask`: padding left or right, causal, sliding windows), the same
causal flag (``is_causal`` only when no mask was needed and more than one query), GQA (key
and value heads shared by groups of query heads: ``enable_gqa``), scaling and dropout, and
the layout transformers expects back: (batch, queries, heads, head_dim), and logit soft-capping
(``softcap``, Gemma 2's ``attn_logit_softcapping``), capped before the mask as transformers'
eager path does. What the kernels do not have is refused with one line naming it, never
dropped: attention sinks (``s_aux``, gpt-oss) and the attention weights (``output_attentions``).
"""

from __future__ import annotations

import torch

from flashlab.api.attention import attention

NAME = "lab_attention"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, position_bias: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` function: query (B, H, Nq, D), key and value (B, H_kv, Nk, D)
    as the model's attention layer passes them; returns ((B, Nq, H, D), None) (no weights)."""
    if kwargs.get("s_aux") is not None:          # gpt-oss: a learned sink logit per head in every softmax
        raise ValueError("s_aux: flashlab attention has no attention sinks (a per-head logit every query "
                         "attends to, as gpt-oss has); load the model with attn_implementation='eager' for it")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: flashlab never forms the attention weights; use "
                         "attn_implementation='eager' to get them")
    q_length, kv_length = query.shape[2], key.shape[2]
    # The causal flag as SDPA takes it: only with no mask (transformers builds none for a plain
    # causal batch) and more than one query (a single decoding query sees every cached key).
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_length > 1 and attention_mask is None and is_causal)
    if is_causal and kv_length > q_length:      # a static cache's unused tail (as transformers' SDPA path)
        key, value = key[:, :, :q_length], value[:, :, :q_length]
        if position_bias is not None:
            position_bias = position_bias[:, :, :, :q_length]
    if position_bias is not None:                # T5-style relative bias: one float mask
        from transformers.integrations.sdpa_attention import create_position_bias_mask
        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False
    out = attention(query, key, value, attn_mask=attention_mask, dropout_p=float(dropout), is_causal=is_causal,
                    scale=scaling, enable_gqa=key.shape[1] != query.shape[1], softcap=kwargs.get("softcap"))
    return out.transpose(1, 2).contiguous(), None


def supports(model) -> bool:
    """Whether a transformers model (or model class) computes attention through ``AttentionInterface``,
    so that a registered implementation is used: transformers' ``_supports_attention_backend``."""
    cls = model if isinstance(model, type) else type(model)
    return bool(getattr(cls, "_supports_attention_backend", False))


def check_model(model) -> None:
    """Raises ValueError, naming the model class and transformers' version, unless `supports`."""
    if not supports(model):
        import transformers
        cls = model if isinstance(model, type) else type(model)
        raise ValueError(f"model: {cls.__name__} on transformers {transformers.__version__} computes attention in its "
                         f"own layers, not through AttentionInterface, so a registered implementation would not be "
                         f"used (a KeyError, or its own attention silently). Use attn_implementation='sdpa' for it, "
                         f"or a transformers version where {cls.__name__} supports attention backends.")


def attach(model, name: str = NAME):
    """Registers flashlab's attention (`register`), checks that ``model`` will use it (`check_model`),
    and sets it as the model's attention implementation. Returns the model."""
    register(name, model=model)
    model.set_attn_implementation(name)
    return model


def register(name: str = NAME, model=None) -> str:
    """Registers flashlab's attention and its mask function with transformers under ``name``
    and returns the name, for ``attn_implementation=``. Names with "flash" in them and
    transformers' own implementations' names ("sdpa", "eager", …) are refused. With ``model`` (a
    model or its class), a model that would not use the registered function is refused (`check_model`)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: {name!r} is not a name; pass a string such as {NAME!r}, or nothing")
    if "flash" in name.lower():
        raise ValueError(f"name: {name!r} contains 'flash', which transformers takes for a hub flash-attention "
                         f"kernel; use another name, e.g. {NAME!r}")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:
        raise ImportError("flashlab.integrations.transformers needs transformers: pip install transformers "
                          "(or install flashlab with its hf extra: pip install '/path/to/flashlab[hf]')") from exc
    # transformers' own implementations: registering over one would silently turn every model of the
    # process that asks for it (attn_implementation="sdpa") into flashlab's, interpreted on a CPU
    builtin = {"eager", *AttentionInterface._global_mapping, *AttentionMaskInterface._global_mapping}
    if name in builtin and AttentionInterface._global_mapping.get(name) is not attention_forward:
        raise ValueError(f"name: {name!r} is transformers' own attention implementation; registering flashlab "
                         f"under it would replace it for every model in the process. Use another name, e.g. {NAME!r}")
    if model is not None:
        check_model(model)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)       # boolean masks, None where is_causal suffices
    return name
