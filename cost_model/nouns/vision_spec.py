"""The vision encoder of a VLM (Qwen3-VL / Qwen3.5 family): its shape, parameters and FLOPs.

The encoder is a ViT: a patch embedding (in_channels x temporal_patch x patch^2 pixels per patch), `depth`
pre-norm layers of bidirectional attention over one image's patches and a GELU MLP (two matrices, with
biases), then a merger that folds spatial_merge^2 patches into one language-model token. Images are square
here (`image_size` pixels a side); an image is repeated to fill the temporal patch, so it has
(image_size / patch_size)^2 patches. Its time and memory are priced in cost_model.vision.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VisionSpec:
    """A ViT encoder, in Hugging Face vision_config names."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    out_hidden_size: int             # the language model's hidden size the merger projects to
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    in_channels: int = 3

    @property
    def params(self) -> int:
        h, f, m = self.hidden_size, self.intermediate_size, self.spatial_merge_size ** 2
        patch_embed = self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * h + h
        layer = (4 * h * h + 4 * h) + (2 * h * f + f + h) + 4 * h   # attention, MLP, two LayerNorms
        merger = (h * m) * (h * m) + h * m + (h * m) * self.out_hidden_size + self.out_hidden_size + 2 * h
        return patch_embed + self.depth * layer + merger

    def patches_per_image(self, image_size: int) -> int:
        """Patches of one square image `image_size` pixels a side (resized to a whole number of merged patches)."""
        side = self.patch_size * self.spatial_merge_size
        cells = max(1, round(image_size / side))
        return (cells * self.spatial_merge_size) ** 2

    def forward_flops(self, patches: float, patches_per_image: int) -> tuple[float, float]:
        """(GEMM, attention) FLOPs of one forward pass over `patches` patches, images of `patches_per_image`."""
        h, f, m = self.hidden_size, self.intermediate_size, self.spatial_merge_size ** 2
        embed = 2 * self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * h
        gemm = patches * (embed + self.depth * 2 * (4 * h * h + 2 * h * f)
                          + 2 * (h * m * h * m + h * m * self.out_hidden_size) / m)
        # bidirectional attention within each image: QK^T and PV over all of its patches
        attention = patches * self.depth * 4 * patches_per_image * h
        return gemm, attention
