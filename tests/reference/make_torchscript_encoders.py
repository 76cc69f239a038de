#!/usr/bin/env python3
"""Writes small TorchScript encoders as a user would export them from Python.

Usage: make_torchscript_encoders.py DIR
  DIR/vae.pt        encode(images) -> 4 latent channels at 1/4 size; decode(latents) -> images
  DIR/vae_wrong.pt  encode() gives 3 channels (a wrong export)
  DIR/vae_scaled.pt vae.pt carrying its own scaling_factor 0.3 (as DC-AE's cfg.scaling_factor)
  DIR/text.pt       forward(prompts: List[str]) -> (features [N, 6, 8], mask [N, 6])
  DIR/hed.pt        forward(x [1, 3, H, W], RGB 0-255) -> five side outputs [1, 1, H/2^i, W/2^i],
                    as upstream's HED network (a tiny stand-in with random weights)
"""
import os
import sys
from typing import List, Tuple

import torch


class Vae(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        torch.manual_seed(0)
        self.enc = torch.nn.Conv2d(3, channels, 4, stride=4)
        self.dec = torch.nn.ConvTranspose2d(channels, 3, 4, stride=4)

    @torch.jit.export
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.enc(images)

    @torch.jit.export
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dec(latents))


class ScaledVae(Vae):
    """Vae with the factor its latents are scaled by, as DC-AE's config has it."""

    def __init__(self, channels: int, scaling_factor: float):
        super().__init__(channels)
        self.scaling_factor = scaling_factor


class Text(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.table = torch.nn.Embedding(256, 8)

    def forward(self, prompts: List[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(prompts), 6, dtype=torch.long)
        mask = torch.zeros(len(prompts), 6, dtype=torch.long)
        for i, p in enumerate(prompts):
            for j, ch in enumerate(p[:6]):
                ids[i, j] = ord(ch) % 256
                mask[i, j] = 1
        return self.table(ids), mask


class Hed(torch.nn.Module):
    """Upstream's ControlNetHED_Apache2 in shape (five VGG-like stages, a 1x1 projection to one
    channel after each, max-pooling between them), 4 channels wide instead of 64 to 512."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.norm = torch.nn.Parameter(torch.full((1, 3, 1, 1), 128.0))
        self.stages = torch.nn.ModuleList([torch.nn.Conv2d(3 if i == 0 else 4, 4, 3, padding=1) for i in range(5)])
        self.projections = torch.nn.ModuleList([torch.nn.Conv2d(4, 1, 1) for _ in range(5)])
        for conv in self.stages:  # edges: weights that answer to local contrast
            torch.nn.init.normal_(conv.weight, std=0.05)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        h = x - self.norm
        sides: List[torch.Tensor] = []
        for i, (stage, projection) in enumerate(zip(self.stages, self.projections)):
            if i > 0:
                h = torch.nn.functional.max_pool2d(h, kernel_size=2, stride=2)
            h = torch.relu(stage(h))
            sides.append(projection(h))
        return sides[0], sides[1], sides[2], sides[3], sides[4]


def main():
    # One argument, a folder: "--help" or a missing argument prints the usage instead of
    # becoming a folder of that name.
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr if len(sys.argv) != 2 else sys.stdout)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.jit.script(Vae(4)).save(os.path.join(out, "vae.pt"))
    torch.jit.script(Vae(3)).save(os.path.join(out, "vae_wrong.pt"))
    torch.jit.script(ScaledVae(4, 0.3)).save(os.path.join(out, "vae_scaled.pt"))
    torch.jit.script(Text()).save(os.path.join(out, "text.pt"))
    torch.jit.script(Hed()).save(os.path.join(out, "hed.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
