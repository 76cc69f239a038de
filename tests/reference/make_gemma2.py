#!/usr/bin/env python3
"""A small random Gemma-2 in transformers' own layout with a SentencePiece tokenizer trained
here, and what transformers computes with them, for sana-train's native Gemma-2
(src/sana/model/gemma2.h) and its caption pipeline (model/tokenizer.h) to match.

Usage: make_gemma2.py DIR [--upstream-width]
  --upstream-width        only DIR/gemma, 2304 wide as gemma-2-2b-it (the width upstream's YAMLs
                          imply), with one layer and small heads, for a run of an upstream YAML
  DIR/gemma/              Gemma2ForCausalLM.save_pretrained: config.json, the weights in shards
                          with model.safetensors.index.json (lm_head tied, so not written), and
                          tokenizer.model with tokenizer_config.json: a folder as a user downloads
  DIR/expected.safetensors
      ids, mask           a right-padded batch of three prompts of different lengths [3, T]
      hidden_fp32         model.get_decoder()(ids, attention_mask=mask).last_hidden_state in fp32
      hidden_bf16         the same with the model in bf16 (upstream's dtype), as fp32
  DIR/case.json           the sizes, for the test to name
  DIR/tokens.json         1000 captions (Unicode, emoji, whitespace runs, long ones, empty ones) and
                          transformers' GemmaTokenizer ids of each (BOS first), plus a batch of
                          them at max_length 16, padding="max_length", truncation=True
  DIR/pipeline.json, DIR/pipeline.safetensors
                          upstream train.py's caption path with these: the CHI prompt in front,
                          tokenized to n_chi + L - 2 with right padding, the decoder, select_index
                          = [0] + range(-L + 1, 0); and the null caption (tokenizer("") at L)

The sizes make every part of the maths matter: sliding_window 5 below the prompt length
(layer 0 and 2 slide), grouped-query attention (4 heads, 2 key-value heads), a soft cap of
2 that the random scores reach, query_pre_attn_scalar unlike head_dim, norm weights away
from zero, and eager attention (the one transformers computes the soft cap in).
"""
import json
import os
import random
import sys

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

out = sys.argv[1]
upstream_width = "--upstream-width" in sys.argv[2:]
os.makedirs(out, exist_ok=True)
torch.manual_seed(7)
rng = random.Random(7)

# Captions: English, accented Latin, CJK, Cyrillic, emoji (outside the BMP, and joined ones),
# runs of spaces, tabs and newlines, digits; lengths from empty to a few hundred tokens.
words = ("a small fluffy white cat curled up on sunny windowsill city street at dusk glowing lamps astronaut "
         "jungle cold colour palette muted mountain lake sunset photo of the with and").split()
words += ["Café", "München", "naïve", "façade", "東京", "の", "夜景", "猫", "Москва", "ночью", "Ωmega", "☃",
          "😀", "🎉", "👍🏽", "👨‍👩‍👧", "🌃", "1024", "3.14", "x²", "«quoted»", "don't", "C++", "#tag"]
seps = [" "] * 12 + ["  ", "\n", "\t", " \n "]


def caption(n):
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n)).strip(" ") if n else ""


corpus = [caption(rng.randint(3, 30)) for _ in range(400)]
# Gemma's tokenizer.model settings: BPE with byte fallback, digits split, no dummy prefix, every
# space kept, no normalisation; pad 0, eos 1, bos 2, unk 3.
spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=out + "/spm", vocab_size=512,
                               pad_id=0, eos_id=1, bos_id=2, unk_id=3, model_type="bpe", byte_fallback=True,
                               split_digits=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
                               allow_whitespace_only_pieces=True, normalization_rule_name="identity",
                               character_coverage=1.0, minloglevel=2)
sizes = dict(hidden_size=2304, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1) if upstream_width else dict(hidden_size=32, intermediate_size=48,
                                                                  num_hidden_layers=3, num_attention_heads=4,
                                                                  num_key_value_heads=2)
config = Gemma2Config(vocab_size=512, **sizes, head_dim=8, query_pre_attn_scalar=12,
                      sliding_window=5, attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                      max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.4,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2, attn_implementation="eager")
model = Gemma2ForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:  # Gemma's norms scale by (1 + w); w starts at zero
            p.copy_(torch.randn_like(p) * 0.5)
model.save_pretrained(out + "/gemma", max_shard_size="10GB" if upstream_width else "40KB")
with open(out + "/spm.model", "rb") as src, open(out + "/gemma/tokenizer.model", "wb") as dst:
    dst.write(src.read())
with open(out + "/gemma/tokenizer_config.json", "w") as f:
    json.dump({"tokenizer_class": "GemmaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
               "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}, f)
tokenizer = AutoTokenizer.from_pretrained(out + "/gemma")
tokenizer.padding_side = "right"  # upstream's builder.py sets it so
if upstream_width:
    sys.exit(0)

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

# The tokenizer on 1000 captions: ten empty, ten of a few hundred words, the rest 1 to 40 words.
captions = [""] * 10 + [caption(rng.randint(150, 300)) for _ in range(10)] + [caption(rng.randint(1, 40))
                                                                             for _ in range(980)]
rng.shuffle(captions)
batch = tokenizer(captions[:40], max_length=16, padding="max_length", truncation=True)
with open(out + "/tokens.json", "w") as f:
    json.dump({"captions": captions, "ids": [tokenizer(c).input_ids for c in captions], "batch_length": 16,
               "batch_ids": batch.input_ids, "batch_mask": batch.attention_mask}, f, ensure_ascii=False)

# Upstream train.py's caption features, on this model in fp32.
prompts = ["a cat on a sunny windowsill", "", captions[next(i for i, c in enumerate(captions) if len(c) > 400)],
           "東京の夜景 🌃 and 👨‍👩‍👧"]
chi_prompt = ["Given a user prompt, generate an enhanced prompt:", "User Prompt: "]
L = 12
decoder = Gemma2ForCausalLM.from_pretrained(out + "/gemma", dtype=torch.float32,
                                            attn_implementation="eager").get_decoder().eval()
chi = "\n".join(chi_prompt)
num_chi_prompt_tokens = len(tokenizer.encode(chi))
max_length_all = num_chi_prompt_tokens + L - 2
tokens = tokenizer([chi + p for p in prompts], max_length=max_length_all, padding="max_length", truncation=True,
                   return_tensors="pt")
select_index = [0] + list(range(-L + 1, 0))
null = tokenizer("", max_length=L, padding="max_length", truncation=True, return_tensors="pt")
with torch.no_grad():
    features = decoder(tokens.input_ids, attention_mask=tokens.attention_mask)[0][:, select_index]
    null_features = decoder(null.input_ids, attention_mask=null.attention_mask)[0][0]
save_file({"features": features.contiguous(), "mask": tokens.attention_mask[:, select_index].contiguous(),
           "null_features": null_features.contiguous()}, out + "/pipeline.safetensors")
with open(out + "/pipeline.json", "w") as f:
    json.dump({"prompts": prompts, "chi_prompt": chi_prompt, "model_max_length": L}, f, ensure_ascii=False)
