"""Tiny random-weight models of the real transformers classes, built offline.

No weights can be downloaded here, so tests and the demo use models of the
real classes (``LlavaForConditionalGeneration`` + ``LlavaProcessor``, ...)
with a few thousand parameters, a real image processor and a small BPE
tokenizer trained in process on the benchmark's own words, saved with
``save_pretrained`` and loaded back exactly like a hub checkpoint. Their
answers are meaningless; what they test is the loading, prompting and
scoring code. Random weights differ across torch versions, so tests check
properties (batched == unbatched), never values.

Each family's backend row names its builder (``verbmirage.models.registry``, ``tiny``);
``python tools/build_tiny_models.py OUT`` writes all of them.
"""

from __future__ import annotations

from pathlib import Path

from verbmirage.benchmark.question_sets import MC_STEM
from verbmirage.core.text import hoi_phrase, object_with_article, verb_phrase

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>"]
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
    from verbmirage.data.hico import (
        hoi_vocabulary,  # deferred: imports pandas and scipy (the job server preloads this module)
    )

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


# Qwen's ChatML layout: "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\n..."
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(
    chat_template: str | None = LLAVA_CHAT_TEMPLATE, vocab_size: int = 1200, image_token: str | None = "<image>",
    extra_special: list[str] | None = None,
):
    """A byte-level BPE tokenizer trained on the benchmark's sentences, as a PreTrainedTokenizerFast.

    ``image_token=None`` leaves the attribute undeclared (InstructBLIP's processor adds its own).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + (extra_special or []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        extra_special_tokens={"image_token": image_token} if image_token else None,
    )
    if chat_template:
        fast.chat_template = chat_template
    return fast


def build_wordpiece_tokenizer(vocab_size: int = 800):
    """A BERT-style WordPiece tokenizer (InstructBLIP's Q-Former reads the question with one)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(_corpus(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")


def lean_to_answers(model, tokenizer, scale: float = 6.0, options: int = 4) -> None:
    """Scale the output rows of the yes/no and option-letter tokens, so a random model usually starts its
    answer with one of them (which one still depends on the prompt and image).

    With plain random weights the first answer token is almost never an answer word, so every decision
    would go through the decoded-text parse and come out ``unknown``; the demo then shows nothing but
    that path. The scale keeps the weights random while exercising both paths (first-token decisions and,
    for the rest, the continued decoding).
    """
    import torch

    from verbmirage.models.hf.tokens import answer_token_ids  # deferred: imports torch

    vocabulary = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    yes, no, letters = answer_token_ids(vocabulary, "tiny model")
    ids = sorted(set(yes + no + [i for group in letters[:options] for i in group]))
    head = model.get_output_embeddings().weight
    if head.data_ptr() == model.get_input_embeddings().weight.data_ptr():
        raise ValueError("tiny model: tied input/output embeddings; scaling the answer rows would change inputs")
    with torch.no_grad():
        head[ids] *= scale


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
    lean_to_answers(model, tokenizer)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def build_tiny_instructblip(out_dir: str | Path, seed: int = 0, image_size: int = 32, patch_size: int = 8) -> Path:
    """InstructBlipForConditionalGeneration (Llama text model) + InstructBlipProcessor with a Q-Former tokenizer."""
    import torch
    from transformers import (
        BlipImageProcessor,
        InstructBlipConfig,
        InstructBlipForConditionalGeneration,
        InstructBlipProcessor,
        InstructBlipQFormerConfig,
        InstructBlipVisionConfig,
        LlamaConfig,
    )

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(chat_template=None, image_token=None)
    qformer_tokenizer = build_wordpiece_tokenizer()
    image_processor = BlipImageProcessor(size={"height": image_size, "width": image_size})
    num_query_tokens = 4
    processor = InstructBlipProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                      qformer_tokenizer=qformer_tokenizer, num_query_tokens=num_query_tokens)
    vision = InstructBlipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, image_size=image_size, patch_size=patch_size)
    qformer = InstructBlipQFormerConfig(vocab_size=len(qformer_tokenizer), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, encoder_hidden_size=32,
                                        max_position_embeddings=128, pad_token_id=qformer_tokenizer.pad_token_id)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    config = InstructBlipConfig(vision_config=vision.to_dict(), qformer_config=qformer.to_dict(),
                                text_config=text.to_dict(), num_query_tokens=num_query_tokens,
                                image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = InstructBlipForConditionalGeneration(config).eval()
    lean_to_answers(model, tokenizer)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def build_tiny_qwen2_vl(out_dir: str | Path, seed: int = 0, version: str = "2") -> Path:
    """Qwen2VLForConditionalGeneration (``version="2"``) or Qwen2_5_VL... (``"2.5"``) + an images-only processor."""
    import torch
    import transformers

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(chat_template=QWEN_CHAT_TEMPLATE, image_token="<|image_pad|>",
                                extra_special=QWEN_SPECIAL_TOKENS)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    prefix = "Qwen2VL" if version == "2" else "Qwen2_5_VL"
    image_processor = transformers.Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=56 * 56)
    from verbmirage.models.hf.tokens import images_only_processor  # deferred: imports torch

    processor = images_only_processor(getattr(transformers, f"{prefix}Processor"))(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN_CHAT_TEMPLATE
    )
    vision = {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3, "in_channels": 3,
              "out_hidden_size": 32, "intermediate_size": 64, "fullatt_block_indexes": [1], "window_size": 56}
    text = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
            "pad_token_id": tokenizer.pad_token_id, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"]}
    config = getattr(transformers, f"{prefix}Config")(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config).eval()
    lean_to_answers(model, tokenizer)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def build_tiny_qwen2_5_vl(out_dir: str | Path, seed: int = 0) -> Path:
    return build_tiny_qwen2_vl(out_dir, seed, version="2.5")


def build_clip_tokenizer(vocab_size: int = 800):
    """A CLIP-style BPE (lower case, "</w>" word ends, <|startoftext|>/<|endoftext|>) as a real CLIPTokenizer.

    Built from the corpus's words, not trained with ``tokenizers``' BpeTrainer: that trainer numbers the
    "x</w>" letters in the order of a hash set, so tied merges and ids came out differently in each process
    and every build of the demo's CLIP answered differently. Here: the specials, every letter plain and with
    "</w>", then the most frequent words (ties by spelling), each merged left to right, until ``vocab_size``.
    """
    import collections
    import re

    from transformers import CLIPTokenizer

    special = ["<|startoftext|>", "<|endoftext|>"]
    # CLIPTokenizer's own pieces: letter runs, single digits, runs of other symbols
    words = collections.Counter(word for line in _corpus()
                                for word in re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]+", f"a photo of a person {line}".lower()))
    letters = sorted({letter for word in words for letter in word})
    vocab = dict.fromkeys([*special, *letters, *(f"{letter}</w>" for letter in letters)])
    merges = []
    for word, _ in sorted(words.items(), key=lambda item: (-item[1], item[0])):
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        steps = [(pieces[0] + "".join(pieces[1:i]), pieces[i]) for i in range(1, len(pieces))]
        new = [step for step in steps if "".join(step) not in vocab]
        if len(vocab) + len(new) > vocab_size:
            break
        for step in new:
            merges.append(step)
            vocab["".join(step)] = None
    return CLIPTokenizer(vocab={token: index for index, token in enumerate(vocab)}, merges=merges)


def build_tiny_clip(out_dir: str | Path, seed: int = 0, image_size: int = 32, patch_size: int = 8) -> Path:
    """CLIPModel + CLIPProcessor (CLIP image processor and a CLIPTokenizer built offline)."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    out_dir = Path(out_dir)
    tokenizer = build_clip_tokenizer()
    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size})
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = CLIPConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 77,
                     "pad_token_id": eos, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": image_size, "patch_size": patch_size},
        projection_dim=16,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir

