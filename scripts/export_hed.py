#!/usr/bin/env python3
"""Exports upstream's HED edge network for ControlNet scribble and HED maps to TorchScript,
the file controlnet.hed_model names (docs/controlnet.md).

Usage: export_hed.py ControlNetHED.pth OUT.pt
       export_hed.py --random OUT.pt      (random weights: checks the export path only)

ControlNetHED.pth is lllyasviel's (huggingface.co/lllyasviel/Annotators), the file upstream's
tools/controlnet/annotator/hed downloads. The network here is its ControlNetHED_Apache2 as
that file's names lay it out: `norm` [1, 3, 1, 1] subtracted from the RGB 0-255 input, then
five stages `blockN` of 3x3 convolutions (`convs.K`, ReLU after each; 2, 2, 3, 3, 3 of them,
64, 128, 256, 512, 512 channels), each but the first after a 2x2 max-pool, each with a 1x1
`projection` to one channel. forward returns the five projections; sana-train resizes,
averages and squashes them as upstream's HEDdetector does."""
import sys
from typing import Tuple

import torch


class Stage(torch.nn.Module):
    def __init__(self, inputs: int, outputs: int, layers: int):
        super().__init__()
        self.convs = torch.nn.Sequential(
            *[torch.nn.Conv2d(inputs if i == 0 else outputs, outputs, 3, padding=1) for i in range(layers)])
        self.projection = torch.nn.Conv2d(outputs, 1, 1)

    def forward(self, x: torch.Tensor, pool: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.max_pool2d(x, kernel_size=2, stride=2) if pool else x
        for conv in self.convs:
            h = torch.relu(conv(h))
        return h, self.projection(h)


class Hed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.zeros(1, 3, 1, 1))
        self.block1 = Stage(3, 64, 2)
        self.block2 = Stage(64, 128, 2)
        self.block3 = Stage(128, 256, 3)
        self.block4 = Stage(256, 512, 3)
        self.block5 = Stage(512, 512, 3)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        h, p1 = self.block1(x - self.norm, False)
        h, p2 = self.block2(h, True)
        h, p3 = self.block3(h, True)
        h, p4 = self.block4(h, True)
        h, p5 = self.block5(h, True)
        return p1, p2, p3, p4, p5


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, out = sys.argv[1:3]
    net = Hed().eval()
    if source != "--random":
        state = torch.load(source, map_location="cpu")
        net.load_state_dict(state, strict=True)  # every name of the file, no other
    torch.jit.script(net).save(out)
    print(f"{out}: HED with {sum(p.numel() for p in net.parameters())} parameters"
          f"{' (random weights)' if source == '--random' else ''}")


if __name__ == "__main__":
    main()
