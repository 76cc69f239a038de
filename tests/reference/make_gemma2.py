#!/usr/bin/env python3
"""A small random Gemma-2 in transformers' own layout, and its decoder's last hidden state as
transformers computes it, for sana-train's native Gemma-2 (src/sana/model/gemma2.h) to match.

Usage: make_gemma2.py DIR
  DIR/gemma/              Gemma2ForCausalLM.save_pretrained: config.json, the weights in shards
                          with model.safetensors.index.json (lm_head tied, so not written)
  DIR/expected.safetensors
      ids, mask           a right-padded batch of three prompts of different lengths [3, T]
      hidden_fp32         model.get_decoder()(ids, attention_mask=mask).last_hidden_state in fp32
      hidden_bf16         the same with the model in bf16 (upstream's dtype), as fp32
  DIR/case.json           the sizes, for the test to name

The sizes make every part of the maths matter: sliding_window 5 below the prompt length
(layer 0 and 2 slide), grouped-query attention (4 heads, 2 key-value heads), a soft cap of
2 that the random scores reach, query_pre_attn_scalar unlike head_dim, norm weights away
from zero, and eager attention (the one transformers computes the soft cap in).
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import Gemma2Config, Gemma2ForCausalLM

out = sys.argv[1]
torch.manual_seed(7)
config = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12,
                      sliding_window=5, attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                      max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.4,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2, attn_implementation="eager")
model = Gemma2ForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:  # Gemma's norms scale by (1 + w); w starts at zero
            p.copy_(torch.randn_like(p) * 0.5)
model.save_pretrained(out + "/gemma", max_shard_size="40KB")

lengths = [11, 7, 3]
T = max(lengths)
ids = torch.zeros(len(lengths), T, dtype=torch.int64)
mask = torch.zeros(len(lengths), T, dtype=torch.int64)
for r, n in enumerate(lengths):
    ids[r, 0] = 2  # BOS, as Gemma's tokenizer puts it
    ids[r, 1:n] = torch.randint(3, config.vocab_size, (n - 1,))
    mask[r, :n] = 1


def hidden(dtype):
    m = Gemma2ForCausalLM.from_pretrained(out + "/gemma", dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return m.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state.float().contiguous()


save_file({"ids": ids, "mask": mask, "hidden_fp32": hidden(torch.float32), "hidden_bf16": hidden(torch.bfloat16)},
          out + "/expected.safetensors")
with open(out + "/case.json", "w") as f:
    json.dump({"lengths": lengths, "layers": config.num_hidden_layers, "sliding_window": config.sliding_window}, f)
