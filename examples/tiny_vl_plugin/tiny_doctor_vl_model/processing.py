"""Multimodal processing of the tiny vision-language model: vLLM's three pieces, no torchvision.

- `TinyDoctorVLImageProcessor`: resize to a square, rescale to [0, 1], normalize, channels
  first. NumPy and Pillow only (transformers' fast image processors need torchvision). Its
  settings are the model directory's `preprocessor_config.json`.
- `TinyDoctorVLProcessingInfo`: what vLLM asks about the model's inputs (one image per prompt,
  how many placeholder tokens an image becomes).
- `TinyDoctorVLDummyInputsBuilder`: the largest input. vLLM processes it at start-up (its
  placeholder count is the encoder budget, as `get_mm_max_tokens_per_item` is not given) and
  again in the renderer's "multi-modal warmup".
- `TinyDoctorVLMultiModalProcessor`: turns an image into `pixel_values` and each `<image>`
  token of the prompt into `num_image_tokens` copies of it; vLLM records where they are and
  the model puts one image embedding on each.

`model.py` attaches them to the model class with `@MULTIMODAL_REGISTRY.register_processor`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature
from vllm.inputs import MultiModalDataDict
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import ImageSize, MultiModalDataItems
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

IMAGE_TOKEN = "<image>"  # the placeholder the user writes in the prompt (a special token)
PREPROCESSOR_CONFIG = "preprocessor_config.json"


class TinyDoctorVLImageProcessor:
    """PIL image(s) -> float32 array [num_images, 3, size, size]."""

    def __init__(
        self,
        size: int,
        image_mean: Sequence[float],
        image_std: Sequence[float],
        rescale_factor: float = 1 / 255,
        resample: int = Image.Resampling.BICUBIC,
    ) -> None:
        self.size = size
        self.image_mean = np.asarray(image_mean, dtype=np.float32).reshape(3, 1, 1)
        self.image_std = np.asarray(image_std, dtype=np.float32).reshape(3, 1, 1)
        self.rescale_factor = rescale_factor
        self.resample = resample

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> TinyDoctorVLImageProcessor:
        settings: dict[str, Any] = json.loads((Path(model_dir) / PREPROCESSOR_CONFIG).read_text())
        return cls(
            size=settings["size"],
            image_mean=settings["image_mean"],
            image_std=settings["image_std"],
            rescale_factor=settings.get("rescale_factor", 1 / 255),
            resample=settings.get("resample", Image.Resampling.BICUBIC),
        )

    def preprocess_one(self, image: Image.Image) -> np.ndarray:
        image = image.convert("RGB").resize((self.size, self.size), resample=self.resample)
        pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) * self.rescale_factor
        return (pixels - self.image_mean) / self.image_std

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        return np.stack([self.preprocess_one(image) for image in images])


class TinyDoctorVLProcessingInfo(BaseProcessingInfo):
    def get_hf_processor(self, **kwargs: object) -> TinyDoctorVLImageProcessor:
        return TinyDoctorVLImageProcessor.from_pretrained(self.ctx.model_config.model)

    def get_supported_mm_processor_kwargs(self) -> dict[str, set[str]]:
        # vLLM's default reads them off a transformers ProcessorMixin; this processor takes none
        return {"text_kwargs": set(), "images_kwargs": set()}

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": 1}

    def get_image_size(self) -> ImageSize:
        size = self.get_hf_config().vision_image_size
        return ImageSize(width=size, height=size)

    def get_num_image_tokens(self) -> int:
        """Every image is resized to one size: always one token per patch."""
        config = self.get_hf_config()
        return (config.vision_image_size // config.vision_patch_size) ** 2


class TinyDoctorVLDummyInputsBuilder(BaseDummyInputsBuilder[TinyDoctorVLProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_TOKEN * mm_counts.get("image", 0)

    def get_dummy_mm_data(
        self,
        seq_len: int,
        mm_counts: Mapping[str, int],
        mm_options: Mapping[str, Any],
    ) -> MultiModalDataDict:
        size = self.info.get_image_size()
        return {
            "image": self._get_dummy_images(
                width=size.width,
                height=size.height,
                num_images=mm_counts.get("image", 0),
                overrides=mm_options.get("image"),
            )
        }


class TinyDoctorVLMultiModalProcessor(BaseMultiModalProcessor[TinyDoctorVLProcessingInfo]):
    def _call_hf_processor(self, *args: Any, **kwargs: Any) -> BatchFeature:
        """The images -> `pixel_values`. vLLM changed this hook's signature: releases up to
        0.2x call it with `(prompt, mm_data, mm_kwargs, tok_kwargs)` and expect the prompt's
        `input_ids` back too; newer ones tokenize the prompt themselves and pass
        `(hf_data, hf_kwargs)` with only the images."""
        if "prompt" in kwargs or (args and isinstance(args[0], str)):
            prompt = kwargs["prompt"] if "prompt" in kwargs else args[0]
            mm_data = kwargs["mm_data"] if "mm_data" in kwargs else args[1]
            tok_kwargs = dict(kwargs["tok_kwargs"] if "tok_kwargs" in kwargs else (args[3] if len(args) > 3 else {}))
            out = BatchFeature({"input_ids": [self.info.get_tokenizer().encode(prompt, **tok_kwargs)]})
            images = mm_data.get("images")
            if images:
                out["pixel_values"] = torch.from_numpy(self.info.get_hf_processor()(list(images)))
            return out
        hf_data = kwargs["hf_data"] if "hf_data" in kwargs else args[0]
        images = hf_data["images"]
        assert isinstance(images, list)
        pixel_values = self.info.get_hf_processor()(images)
        return BatchFeature({"pixel_values": torch.from_numpy(pixel_values)})

    def _hf_processor_applies_updates(self, *args: Any, **kwargs: Any) -> bool:
        # (releases that ask) the processor above never expands the placeholder: vLLM does
        return False

    def _get_mm_fields_config(
        self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        return {"pixel_values": MultiModalFieldConfig.batched("image")}

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        # the model config names the placeholder token; the tokenizer must agree with it
        image_token_id = self.info.get_hf_config().image_token_index
        num_tokens = self.info.get_num_image_tokens()
        return [
            PromptReplacement(
                modality="image",
                target=[image_token_id],
                replacement=[image_token_id] * num_tokens,
            )
        ]
