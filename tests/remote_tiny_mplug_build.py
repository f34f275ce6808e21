"""Build a tiny random-weight mPLUG-Owl2 checkpoint from the ``mplug_owl2`` package's own classes.

    <mplug env python> tests/remote_tiny_mplug_build.py <folder holding mplug_owl2/> <output folder>

Runs in the model's worker env (transformers 4.31), never in the project's.
The package is imported from ``../shared/remote_code/mplug_owl2`` (not from
this repository). Its checkpoints ship a LLaMA-2 sentencepiece tokenizer that
is not in that folder, so a small one with the same special ids (unk 0, bos
1, eos 2, byte fallback) is trained here; the config is the 7B one shrunk to a
few hundred thousand parameters, at 56 px so the vision tower stays cheap.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

#: Sentences that make the answers whole pieces ("▁Yes", "▁No", "▁yes", "▁no", "▁A"...) and a few look-alikes
#: ("▁Nobody", "▁Yesterday", "▁nothing") that must not count as answers.
CORPUS = [
    "USER: Is someone riding the horse? ASSISTANT: Yes",
    "USER: Is a person eating a pizza? ASSISTANT: No",
    "Answer yes or no. yes no Yes No Yes No",
    "Answer with the option's letter from the given choices directly. A B C D",
    "A. riding B. feeding C. washing D. holding",
    "Nobody was there yesterday. Yesterday nothing happened, nothing at all.",
    "a person is holding an umbrella while someone is riding a bicycle next to a dog",
]
LLM_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "max_position_embeddings": 512}
VISION_SIZES = {"hidden_size": 32, "intermediate_size": 64, "projection_dim": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "image_size": 56, "patch_size": 14}
ABSTRACTOR_SIZES = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                    "num_learnable_queries": 8, "encoder_hidden_size": 32, "grid_size": 4}


def train_tokenizer(target: Path) -> Path:
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 30), model_writer=model, vocab_size=360, model_type="bpe",
        byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
        normalization_rule_name="identity", num_threads=1, minloglevel=2,
    )
    path = target / "tokenizer.model"
    path.write_bytes(model.getvalue())
    return path


def build(code_dir: Path, target: Path) -> None:
    sys.path.insert(0, str(code_dir.resolve()))
    import torch
    from mplug_owl2.model import MPLUGOwl2Config, MPLUGOwl2LlamaForCausalLM
    from transformers import CLIPImageProcessor, LlamaTokenizer

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = LlamaTokenizer(vocab_file=str(train_tokenizer(target)))
    tokenizer.save_pretrained(str(target))
    config = MPLUGOwl2Config(visual_config={"visual_model": VISION_SIZES, "visual_abstractor": ABSTRACTOR_SIZES},
                             vocab_size=len(tokenizer), **LLM_SIZES)
    torch.manual_seed(0)
    model = MPLUGOwl2LlamaForCausalLM(config)
    with torch.no_grad():  # weights of a realistic scale; the tiny model tests code paths, not answers
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.05)
    model.save_pretrained(str(target))
    processor = CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor.save_pretrained(str(target))
    write_probe(model.eval(), tokenizer, processor, target)
    print(f"built {type(model).__name__} with {sum(p.numel() for p in model.parameters()):,} parameters in {target}")


PROBE_QUESTION = "Is someone riding a horse?"


def write_probe(model, tokenizer, processor, target: Path) -> None:
    """Logits of the model as built (before any save/load), by the package's README steps, for one image.

    The test compares the adapter's logits with these, so a checkpoint that
    loads differently from how it was built (a buffer left unset) cannot pass.
    """
    import json

    import numpy as np
    import torch
    from mplug_owl2.constants import DEFAULT_IMAGE_TOKEN, IMAGE_TOKEN_INDEX
    from mplug_owl2.conversation import conv_templates
    from mplug_owl2.mm_utils import process_images, tokenizer_image_token
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 60, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(target / "probe.png")
    conversation = conv_templates["mplug_owl2"].copy()
    conversation.append_message(conversation.roles[0], DEFAULT_IMAGE_TOKEN + PROBE_QUESTION)
    conversation.append_message(conversation.roles[1], None)
    ids = tokenizer_image_token(conversation.get_prompt(), tokenizer, IMAGE_TOKEN_INDEX, return_tensors="pt")
    images = process_images([Image.open(target / "probe.png").convert("RGB")], processor)
    with torch.inference_mode():
        logits = model(input_ids=ids.unsqueeze(0), images=images).logits[0, -1]
    (target / "probe.json").write_text(json.dumps({"question": PROBE_QUESTION, "logits": logits.tolist()}))


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]))
