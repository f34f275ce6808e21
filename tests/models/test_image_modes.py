"""How images reach a transformers backend's processor (``image_mode``), against references computed here.

``pad`` is the original LLaVA-1.5's ``expand2square`` in the processor's mean colour, then the processor (on a
square: a plain resize); ``resize`` squashes to the square input size (OPERA's processor); ``crop`` is llava-hf's
processor as shipped (short side, then the centre). The attention analysis maps boxes to the patches each mode
really shows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from snakemake.utils import validate

from verbmirage.analysis.attention import clip_style_grid
from verbmirage.workflow.config import check_config
from verbmirage.core.errors import ConfigError
from verbmirage.models.derived import effective_models
from verbmirage.models import create_model
from verbmirage.models.registry import BACKENDS

WIDTH, HEIGHT = 640, 480  # the most common HICO size


@pytest.fixture(scope="module")
def photo():
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))


def _llava(tiny_dirs, mode=None):
    entry = {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True}
    return create_model("tiny", {**entry, **({"image_mode": mode} if mode else {})})


def _normalised(image: Image.Image, processor) -> np.ndarray:
    """Rescale to [0, 1] and normalise with the processor's mean and std, channels first (as pixel_values)."""
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = (array - np.array(processor.image_mean, dtype=np.float32)) / np.array(processor.image_std, np.float32)
    return array.transpose(2, 0, 1)


def _pixels(model, image) -> np.ndarray:
    return model.encode([model.render_turn("Is someone riding a horse?")], [image])["pixel_values"][0].numpy()


def test_pad_is_expand_to_square_in_the_mean_colour_then_a_resize(tiny_dirs, photo):
    model = _llava(tiny_dirs, "pad")
    processor = model.processor.image_processor
    side = processor.crop_size["height"]
    # expand2square by hand: a 640 x 640 canvas of int(mean * 255), the photo 80 px down
    canvas = np.empty((WIDTH, WIDTH, 3), dtype=np.uint8)
    canvas[:] = [int(value * 255) for value in processor.image_mean]
    canvas[(WIDTH - HEIGHT) // 2 : (WIDTH - HEIGHT) // 2 + HEIGHT] = np.asarray(photo)
    expected = _normalised(Image.fromarray(canvas).resize((side, side), Image.BICUBIC), processor)
    np.testing.assert_allclose(_pixels(model, photo), expected, atol=1e-5)


def test_resize_squashes_and_crop_cuts_the_sides(tiny_dirs, photo):
    squashed, cropped = _llava(tiny_dirs, "resize"), _llava(tiny_dirs)
    processor = cropped.processor.image_processor
    side = processor.crop_size["height"]
    assert cropped.image_mode == "crop"  # the default: llava-hf's processor as shipped
    np.testing.assert_allclose(_pixels(squashed, photo),
                               _normalised(photo.resize((side, side), Image.BICUBIC), processor), atol=1e-5)
    wide = int(side * WIDTH / HEIGHT)  # short side to `side`, then the centre `side` columns
    left = (wide - side) // 2
    resized = photo.resize((wide, side), Image.BICUBIC).crop((left, 0, left + side, side))
    np.testing.assert_allclose(_pixels(cropped, photo), _normalised(resized, processor), atol=1e-5)
    assert not np.allclose(_pixels(squashed, photo), _pixels(cropped, photo))


def test_the_key_area_grid_follows_the_mode(tiny_dirs):
    """A box at the image's left border: inside the patches under pad and resize, cut away under crop."""
    processor = _llava(tiny_dirs).processor.image_processor
    grid_side = 4
    border = [(1, 1, 100, 480)]  # 1-based x1, y1, x2, y2: the leftmost 100 px, full height
    for mode, seen in (("pad", True), ("resize", True), ("crop", False)):
        grid = clip_style_grid(processor, WIDTH, HEIGHT, grid_side, image_mode=mode)
        assert (len(grid.key_tokens(border)) > 0) == seen, mode
    # pad: the photo's top edge sits 80 px down the 640 square, scaled to the processor's side
    pad = clip_style_grid(processor, WIDTH, HEIGHT, grid_side, image_mode="pad")
    assert pad.offset_y == pytest.approx(80 * processor.crop_size["height"] / WIDTH)


def test_a_mode_the_backend_does_not_have_is_refused_when_planned(tiny_dirs):
    assert BACKENDS["qwen2_vl"].image_modes == ("native",) and "crop" not in BACKENDS["instructblip"].image_modes
    with pytest.raises(ValueError, match=r"models.tiny.image_mode: 'square' is not one of \['crop', 'pad', 'resize'\]"):
        _llava(tiny_dirs, "square")


def test_the_plan_stops_on_a_mode_the_backend_lacks_and_the_paper_pads_llava():
    repo = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((repo / "config.yaml").read_text())
    validate(config, str(repo / "schemas/config.schema.yaml"))
    config["models"]["tiny_llava"]["image_mode"] = "native"
    with pytest.raises(ConfigError, match=r"models\.tiny_llava\.image_mode: 'native' is not one of "
                                          r"\['crop', 'pad', 'resize'\] for backend 'llava'"):
        check_config(config, repo)
    paper = yaml.safe_load((repo / "configs/paper.yaml").read_text())
    llava_family = [slug for slug, entry in paper["models"].items() if entry.get("backend") == "llava"]
    assert llava_family and all(paper["models"][slug]["image_mode"] == "pad" for slug in llava_family)


    paper["models"]["nullu"] = {"derive": {"method": "nullu", "base": llava_family[0]}}
    paper["models"]["pangea"] = {"derive": {"method": "lora_finetune", "base": llava_family[0]}}
    models = effective_models(paper)  # the derived models see (and are built from) the padded images too
    assert models["nullu"]["image_mode"] == models["pangea"]["image_mode"] == "pad"
