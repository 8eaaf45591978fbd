"""A tiny Llama model generated on the spot: a real model directory for a real vLLM engine, no download.

Shape: hidden 128, 2 attention heads of 64 (the CPU attention kernels reject
head_dim 16), 1 KV head, 2 layers, intermediate 256, a byte-level BPE vocabulary of about 500.
Weights are random but seeded, so two calls give the same files. The output is garbage text;
what matters is that the engine loads it, plans for it and serves it in seconds.

`transformers`, `tokenizers` and `torch` are imported inside the function: the sandbox extra
brings them, and importing this module costs nothing without them.

    python -m npu_sandbox.tiny_model DIR

builds it into DIR in a process of its own (callers that must not import torch themselves).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

HIDDEN_SIZE: Final = 128
NUM_HEADS: Final = 2
NUM_KV_HEADS: Final = 1
NUM_LAYERS: Final = 2
INTERMEDIATE_SIZE: Final = 256
VOCAB_SIZE: Final = 512
MAX_POSITIONS: Final = 1024
SEED: Final = 20260101

# The tokenizer is trained on these; every byte is in the byte-level alphabet anyway.
_CORPUS: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "Graph capture records the whole decode step once and replays it for every token.",
    "An operator reconciles the desired state with what runs in the cluster.",
    "Ascend NPUs serve large language models with vLLM in graph mode.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Once upon a time there was a small model that answered every question.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
)
_SPECIAL_TOKENS: Final = ("<s>", "</s>", "<unk>", "<pad>")


def build_tiny_model(directory: str | Path) -> Path:
    """Write a tiny LlamaForCausalLM with its tokenizer into `directory` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(_CORPUS), trainer=trainer)
    fast_tokenizer: Any = PreTrainedTokenizerFast  # untyped in some transformers releases
    tokenizer = fast_tokenizer(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.save_pretrained(path)

    settings: dict[str, Any] = {
        "vocab_size": bpe.get_vocab_size(),
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HIDDEN_SIZE // NUM_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
        # "auto" dtype in vLLM reads this; transformers 5 calls it dtype and still takes the old name
        "torch_dtype": "float32",
    }
    config = LlamaConfig(**settings)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model_class: Any = LlamaForCausalLM
        model = model_class(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(path, safe_serialization=True)
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}, indent=2) + "\n"
    )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m npu_sandbox.tiny_model DIR`: build the tiny model into DIR."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m npu_sandbox.tiny_model DIR", file=sys.stderr)
        return 2
    build_tiny_model(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
