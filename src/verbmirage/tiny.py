"""Tiny random-weight models of the real transformers classes, built offline.

No weights can be downloaded here, so tests and the demo use models of the
real classes (``LlavaForConditionalGeneration`` + ``LlavaProcessor``, ...)
with a few thousand parameters, a real image processor and a small BPE
tokenizer trained in process on the benchmark's own words, saved with
``save_pretrained`` and loaded back exactly like a hub checkpoint. Their
answers are meaningless; what they test is the loading, prompting and
scoring code. Random weights differ across torch versions, so tests check
properties (batched == unbatched), never values.

``python tools/build_tiny_models.py OUT`` writes all of them.
"""

from __future__ import annotations

from pathlib import Path

from verbmirage.hico import hoi_vocabulary
from verbmirage.questions import MC_STEM
from verbmirage.text import hoi_phrase, object_with_article, verb_phrase

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
# A LLaVA-1.5 style chat template: "USER: <image>\n{text} ASSISTANT:" (written for these tests).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% if message['role'] != 'user' %}</s>{% endif %} "
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _corpus() -> list[str]:
    """Sentences the tokenizer must encode compactly: every question and answer of the benchmark."""
    vocab = hoi_vocabulary()
    lines = ["USER: ASSISTANT: Yes No yes no A B C D", MC_STEM]
    lines += [f"Is someone {hoi_phrase(v, o)}? Is someone {verb_phrase(v)} something?" for v, o in zip(vocab.verb, vocab.object)]
    lines += [f"Is there {object_with_article(o)} in the image?" for o in sorted(set(vocab.object))]
    lines += ["Answer yes or no.", "Answer with the option's letter from the given choices directly.",
              "Pay attention to the verb in question.", "A. B. C. D."]
    # Frequent enough that the chat words and the answers become single tokens.
    answers = ["USER: ASSISTANT: Yes", "ASSISTANT: No", "ASSISTANT: A", "ASSISTANT: B", "ASSISTANT: C", "ASSISTANT: D",
               "Yes yes No no"]
    return lines * 3 + answers * 50


def build_tokenizer(chat_template: str = LLAVA_CHAT_TEMPLATE, vocab_size: int = 1200):
    """A byte-level BPE tokenizer trained on the benchmark's sentences, as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    fast.chat_template = chat_template
    return fast


def build_tiny_llava(
    out_dir: str | Path, seed: int = 0, image_size: int = 32, patch_size: int = 8, hidden_size: int = 32,
    layers: int = 2,
) -> Path:
    """LlavaForConditionalGeneration + LlavaProcessor (CLIP image processor), ~100K parameters.

    ``image_size=336, patch_size=14`` gives LLaVA-1.5's geometry (576 image tokens).
    """
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
        vision_feature_select_strategy="default", chat_template=LLAVA_CHAT_TEMPLATE,
        num_additional_image_tokens=1,  # the CLS token, as in the llava-hf checkpoints
    )
    vision = CLIPVisionConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers, num_attention_heads=2,
        image_size=image_size, patch_size=patch_size, projection_dim=hidden_size,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max(512, 2 * (image_size // patch_size) ** 2),
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=(image_size // patch_size) ** 2, vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


# Family name -> builder; rule `tiny_model` and tools/build_tiny_models.py use this table.
BUILDERS = {"llava": build_tiny_llava}
