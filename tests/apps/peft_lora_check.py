#!/usr/bin/env python3
"""diffusers and peft as the judges of our LoRA files: SanaPipeline's own LoRA loading
(lora_state_dict, then load_lora_into_transformer, the two halves of load_lora_weights) puts
each adapter file onto diffusers' SanaTransformer2DModel of the base folder with no missing or
unexpected key and peft's LoraConfig built from the file's metadata; the adapted transformer's
forward equals that of our `export --merge-lora` folder, loaded as plain diffusers weights.

usage: peft_lora_check.py BASE_FOLDER MERGED_FOLDER LORA_FILE [EMA_LORA_FILE]
Prints what the packages saw; exit 1 on the first mismatch."""
import logging
import sys

import diffusers
import peft
import torch
from diffusers import SanaPipeline, SanaTransformer2DModel


class Warnings(logging.Handler):
    """What diffusers and peft log while loading: a missing or unexpected key is a warning there."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    side = config.sample_size
    x = torch.randn(2, config.in_channels, side, side, generator=g)
    y = torch.randn(2, 6, config.caption_channels, generator=g)
    mask = torch.ones(2, 6)
    mask[0, 4:] = 0
    return x, y, torch.tensor([93.0, 750.0]) * config.timestep_scale, mask


def forward(model, x, y, t, mask):
    with torch.no_grad():
        return model(hidden_states=x, encoder_hidden_states=y, timestep=t, encoder_attention_mask=mask,
                     return_dict=False)[0]


def adapted(base_folder, lora_file, name):
    """The base transformer with the file's adapter, loaded as load_lora_weights does."""
    model = SanaTransformer2DModel.from_pretrained(base_folder, torch_dtype=torch.float32).eval()
    caught = Warnings()
    loggers = [logging.getLogger(n) for n in ("diffusers", "peft")]
    for log in loggers:
        log.addHandler(caught)
    try:
        state, metadata = SanaPipeline.lora_state_dict(lora_file, return_lora_metadata=True)
        SanaPipeline.load_lora_into_transformer(state, transformer=model, adapter_name=name, metadata=metadata)
    finally:
        for log in loggers:
            log.removeHandler(caught)
    keys = [w for w in caught.lines if "key" in w.lower()]
    config = model.peft_config[name]
    return model, state, keys, config


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    base_folder, merged_folder, lora_file = sys.argv[1:4]
    ok = True
    model, state, keys, config = adapted(base_folder, lora_file, "lora")
    base = SanaTransformer2DModel.from_pretrained(base_folder, torch_dtype=torch.float32).eval()
    merged = SanaTransformer2DModel.from_pretrained(merged_folder, torch_dtype=torch.float32).eval()
    x, y, t, mask = inputs(model.config, 5)
    with_adapter, merged_out, base_out = forward(model, x, y, t, mask), forward(merged, x, y, t, mask), \
        forward(base, x, y, t, mask)
    diff, moved = rel(with_adapter, merged_out), rel(with_adapter, base_out)
    print(f"diffusers {diffusers.__version__}, peft {peft.__version__}: {lora_file.split('/')[-1]}: "
          f"{len(state)} tensors, LoraConfig r {config.r}, lora_alpha {config.lora_alpha}, "
          f"{len(config.target_modules)} target modules; key warnings: {keys or 'none'}; "
          f"adapted vs merged export {diff:.2e}, vs the base {moved:.2e}")
    ok &= not keys and diff <= 1e-5 and moved > 1e-4
    if len(sys.argv) == 5:
        ema, ema_state, ema_keys, ema_config = adapted(base_folder, sys.argv[4], "ema")
        ema_out = forward(ema, x, y, t, mask)
        print(f"EMA adapters {sys.argv[4].split('/')[-1]}: {len(ema_state)} tensors, r {ema_config.r}; key warnings: "
              f"{ema_keys or 'none'}; vs the base {rel(ema_out, base_out):.2e}, vs the trained adapters "
              f"{rel(ema_out, with_adapter):.2e}")
        ok &= not ema_keys and len(ema_state) == len(state) and ema_config.r == config.r and \
            rel(ema_out, base_out) > 0 and ema_out.isfinite().all().item()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
