"""Build a tiny random-weight Qwen2 chat model for vLLM integration tests, offline, in seconds.

Run with the vLLM venv's interpreter (it needs torch, transformers and tokenizers):

    $STM_VLLM_PYTHON tests/vllm/build_tiny_model.py OUTPUT_DIR [--seed 0] [--vocab-size 1000]

The tokenizer is a byte-level BPE trained on this interpreter's own stdlib sources; the weights are
random (fixed seed), so the model's text is noise: tests check protocol, determinism and
structured output, not content. head_dim is 64, one of the sizes vLLM's CPU attention accepts.
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterator
from pathlib import Path

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Deterministic training text: a fixed, sorted list of stdlib modules (plus some JSON-ish text).
CORPUS_MODULES = ("json", "textwrap", "string.py", "argparse.py", "http", "email")


def corpus() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in CORPUS_MODULES:
        path = stdlib / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                yield file.read_text(encoding="utf-8", errors="replace")
    yield (
        '{"error": "", "response": "{\\"status\\": \\"ok\\", \\"data\\": [1, 2, 3]}"}\n'
        * 50
    )


def build_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, model_max_length=4096
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    vocab_size: int, pad_id: int, eos_id: int, seed: int
):  # -> Qwen2ForCausalLM
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,  # head_dim = 64 / 1 = 64
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=1000)
    args = parser.parse_args(argv)

    tokenizer = build_tokenizer(args.vocab_size)
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD, IM_END])
    model = build_model(len(tokenizer), pad_id, eos_id, args.seed)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(args.output_dir)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    print(
        f"tiny model: vocab {len(tokenizer)}, {sum(p.numel() for p in model.parameters())} params "
        f"-> {args.output_dir}"
    )


if __name__ == "__main__":
    main()
