"""`hf:TYPE@SIZE`: a transformers model type's default configuration scaled to about SIZE parameters
(`0.5b`, `125m`, `tiny`), for a language model measured with random weights and nothing downloaded.

A size picks a width from the public small models' shapes (Qwen2.5-0.5B's 896 wide with 2 key/value
heads for ~0.5B, ...) and then the number of layers that brings the parameter count, counted on
PyTorch's meta device for this very type (its vocabulary, tied or untied embeddings, MLP), closest
to the size. `tiny` is a test model: 128 wide (one int4 group), 2 layers, a vocabulary of 1024.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from autotune.model.errors import ApplyError

TINY = "tiny"
# (largest size it is picked for, in parameters) -> hidden, intermediate, attention heads, key/value heads
WIDTHS = (
    (60e6, (256, 768, 4, 2)),
    (250e6, (768, 2048, 12, 4)),
    (900e6, (896, 4864, 14, 2)),  # Qwen2.5-0.5B
    (2.5e9, (1536, 8960, 12, 2)),  # Qwen2.5-1.5B
    (float("inf"), (3584, 18944, 28, 4)),  # Qwen2.5-7B
)
LARGEST = 20e9  # a random 20B model in fp32 is 80 GB: more than any machine this measures


def parse_size(text: str) -> float:
    """`0.5b`, `500m`, `1.5B` -> parameters; `tiny` -> 0 (the test model); anything else is refused."""
    wanted = text.strip().lower()
    if wanted == TINY:
        return 0.0
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([mb])", wanted)
    if found is None:
        raise ApplyError(f"model size {text!r} is not a size; give parameters like 0.5b, 125m or 1.5b (or tiny)")
    params = float(found.group(1)) * (1e9 if found.group(2) == "b" else 1e6)
    if not 1e6 <= params <= LARGEST:
        raise ApplyError(f"model size {text!r} is out of range; give 1m to 20b parameters")
    return params


def sized(config: Any, params: float) -> Any:
    """`config` scaled to about `params` parameters (0: the tiny test model)."""
    scaled = copy.deepcopy(config)
    if params == 0:
        _shape(scaled, (128, 256, 4, 2), layers=2)
        scaled.vocab_size = 1024
        for special in ("pad_token_id", "bos_token_id", "eos_token_id"):  # within the smaller vocabulary
            if isinstance(getattr(scaled, special, None), int) and getattr(scaled, special) >= scaled.vocab_size:
                setattr(scaled, special, scaled.vocab_size - 1)
        return scaled
    width = next(shape for limit, shape in WIDTHS if params <= limit)
    _shape(scaled, width, layers=1)
    one = count(scaled)
    _shape(scaled, width, layers=2)
    per_layer = count(scaled) - one
    layers = max(1, round((params - (one - per_layer)) / per_layer))
    _shape(scaled, width, layers=layers)
    return scaled


def _shape(config: Any, width: tuple[int, int, int, int], layers: int) -> None:
    """Set a configuration's width and depth under whichever names its type uses (gpt2's n_embd,
    n_inner ... through its attribute map)."""
    hidden, intermediate, heads, kv_heads = width
    config.hidden_size, config.num_attention_heads, config.num_hidden_layers = hidden, heads, layers
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = kv_heads
    if hasattr(config, "n_inner"):  # gpt2 and its kin
        config.n_inner = intermediate
    else:
        config.intermediate_size = intermediate
    if hasattr(config, "head_dim"):  # types that keep it apart (llama, qwen2 since transformers 5)
        config.head_dim = hidden // heads
    if getattr(config, "layer_types", None):  # one attention kind per layer (qwen2): as many as the layers
        config.layer_types = [config.layer_types[0]] * layers


def count(config: Any) -> int:
    """The parameters a causal LM of `config` holds, counted without allocating them."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
