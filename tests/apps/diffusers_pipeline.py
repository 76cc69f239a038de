#!/usr/bin/env python3
"""diffusers' SanaPipeline assembled around our exported transformer: the folder that
`sana-train export --format diffusers` wrote, a tiny random AutoencoderDC, a tiny random
Gemma2Model (the decoder upstream's get_decoder() gives) and a Gemma tokenizer from a
SentencePiece model trained here, all made in this script (no hub access). The pipeline
samples 2 steps with classifier-free guidance and decodes: the transformer runs once per step
on the doubled batch, and the images come out finite, in [0, 1], at the size asked for.

usage: diffusers_pipeline.py TRANSFORMER_FOLDER WORK_DIR
Prints what ran; exit 1 when the pipeline fails or its output is not as above."""
import os
import sys

import diffusers
import sentencepiece as spm
import torch
import transformers
from diffusers import AutoencoderDC, DPMSolverMultistepScheduler, SanaPipeline, SanaTransformer2DModel
from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer


def tokenizer_in(work):
    folder = os.path.join(work, "tokenizer")
    os.makedirs(folder, exist_ok=True)
    corpus = ["a photo of a cat on the grass", "a dog by the sea", "mountains at sunset", "a red boat"] * 25
    # Gemma's special ids: pad 0, eos 1, bos 2, unk 3.
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=os.path.join(folder, "tokenizer"),
                                   vocab_size=40, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
                                   eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>", minloglevel=2,
                                   hard_vocab_limit=False)
    return GemmaTokenizer.from_pretrained(folder)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, work = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    transformer = SanaTransformer2DModel.from_pretrained(folder, torch_dtype=torch.float32)
    cfg = transformer.config
    tokenizer = tokenizer_in(work)
    text_encoder = Gemma2Model(Gemma2Config(vocab_size=len(tokenizer), hidden_size=cfg.caption_channels,
                                            intermediate_size=2 * cfg.caption_channels, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                            max_position_embeddings=64, pad_token_id=0)).eval()
    # Widths 12 and 24: the shortcuts repeat or group the latent channels (3 here), which must divide them.
    vae = AutoencoderDC(in_channels=3, latent_channels=cfg.in_channels, attention_head_dim=8,
                        encoder_block_types=("ResBlock", "EfficientViTBlock"),
                        decoder_block_types=("ResBlock", "EfficientViTBlock"),
                        encoder_block_out_channels=(12, 24), decoder_block_out_channels=(12, 24),
                        encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                        scaling_factor=0.41407).eval()
    scheduler = DPMSolverMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    pipe = SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                        scheduler=scheduler)
    calls = []
    transformer.register_forward_hook(lambda module, args, kwargs_out: calls.append(args[0].shape[0]))
    side = cfg.sample_size * pipe.vae_scale_factor
    out = pipe(prompt=["a photo of a cat", "a dog by the sea"], num_inference_steps=2, guidance_scale=4.5,
               height=side, width=side, output_type="pt", use_resolution_binning=False,
               complex_human_instruction=None, max_sequence_length=8).images
    ok = (calls == [4, 4] and tuple(out.shape) == (2, 3, side, side) and bool(torch.isfinite(out).all())
          and out.min().item() >= 0 and out.max().item() <= 1)
    print(f"diffusers {diffusers.__version__}, transformers {transformers.__version__}: SanaPipeline with our "
          f"transformer ({cfg.num_layers} blocks), AutoencoderDC (x{pipe.vae_scale_factor}), Gemma2Model "
          f"({cfg.caption_channels} wide), {len(tokenizer)}-token Gemma tokenizer: {len(calls)} transformer calls "
          f"on batches {calls}; images {list(out.shape)} in [{out.min().item():.3f}, {out.max().item():.3f}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
