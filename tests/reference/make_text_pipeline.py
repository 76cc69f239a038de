#!/usr/bin/env python3
"""Upstream's caption pipeline on a small SentencePiece tokenizer and a TorchScript encoder
that takes token ids, for the C++ trainer's CaptionTokenizer / FrozenTextEncoder to match.

Usage: make_text_pipeline.py DIR
  DIR/spm.model           a SentencePiece model trained here (ids as Gemma's: pad 0, eos 1, bos 2, unk 3)
  DIR/ids_encoder.pt      forward(input_ids [N, T], attention_mask [N, T]) -> features [N, T, 8]; causal
                          (each token's features depend on the tokens before it), as a decoder's are
  DIR/case.json           captions, chi_prompt, model_max_length
  DIR/expected.safetensors
      gemma_features, gemma_mask: upstream train.py's path for a Gemma encoder: the CHI prompt lines
          joined by "\\n" in front of each caption, tokenized as Hugging Face's tokenizer(...,
          max_length=n_chi + L - 2, padding="max_length", truncation=True) does for Gemma (BOS first,
          right padding), the encoder run, then select_index = [0] + range(-L + 1, 0)
      t5_features, t5_mask: the T5 branch: no CHI prompt, EOS last, L tokens
      null_features: tokenizer("", max_length=L, padding="max_length") through the encoder, row 0
"""
import json
import struct
import sys

import numpy as np
import sentencepiece as spm
import torch

out = sys.argv[1]
corpus = [
    "a small fluffy white cat curled up on a sunny windowsill",
    "a bustling city street at dusk with glowing street lamps",
    "an astronaut in a jungle, cold color palette, muted colors",
    "a photo of a mountain with a realistic sunset and a blue lake",
    "Given a user prompt, generate an enhanced prompt with visual details",
    "User Prompt: a dog running on the beach",
] * 20
spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=out + "/spm", vocab_size=80,
                               pad_id=0, eos_id=1, bos_id=2, unk_id=3, character_coverage=1.0,
                               model_type="unigram", minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=out + "/spm.model")


class IdsEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.table = torch.nn.Embedding(80, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.table(input_ids) * attention_mask.unsqueeze(-1).float()
        return torch.cumsum(x, dim=1) / (1.0 + torch.arange(input_ids.shape[1]).float()).view(1, -1, 1)


encoder = IdsEncoder().eval()
torch.jit.script(encoder).save(out + "/ids_encoder.pt")


def hf_tokenize(texts, max_length, bos, eos):
    """tokenizer(texts, max_length, padding="max_length", truncation=True): special tokens kept."""
    ids = np.zeros((len(texts), max_length), dtype=np.int64)
    mask = np.zeros((len(texts), max_length), dtype=np.int64)
    for r, text in enumerate(texts):
        pieces = sp.encode(text)
        budget = max_length - int(bos) - int(eos)
        row = ([2] if bos else []) + pieces[:budget] + ([1] if eos else [])
        ids[r, :len(row)] = row
        mask[r, :len(row)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


captions = ["a cat on a windowsill", "", "a very long caption about a city street at dusk with many glowing lamps"]
chi_prompt = ["Given a user prompt, generate an enhanced prompt:", "User Prompt: "]
L = 6
results = {}
with torch.no_grad():
    # Gemma: upstream train.py's CHI branch.
    chi = "\n".join(chi_prompt)
    prompts_all = [chi + c for c in captions]
    num_chi_prompt_tokens = len([2] + sp.encode(chi))  # len(tokenizer.encode(chi_prompt)), BOS included
    max_length_all = num_chi_prompt_tokens + L - 2
    ids, mask = hf_tokenize(prompts_all, max_length_all, bos=True, eos=False)
    select_index = [0] + list(range(-L + 1, 0))
    y = encoder(ids, mask)[:, select_index]
    results["gemma_features"] = y
    results["gemma_mask"] = mask[:, select_index]
    # T5: no CHI prompt, EOS last.
    ids, mask = hf_tokenize(captions, L, bos=False, eos=True)
    results["t5_features"] = encoder(ids, mask)
    results["t5_mask"] = mask
    # The null caption: the empty prompt, L tokens, no CHI prompt, no selection.
    ids, mask = hf_tokenize([""], L, bos=True, eos=False)
    results["null_features"] = encoder(ids, mask)[0]

header, blobs, offset = {}, [], 0
for name, t in results.items():
    data = t.double().numpy().tobytes()
    header[name] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
text = json.dumps(header).encode()
with open(out + "/expected.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
json.dump({"captions": captions, "chi_prompt": chi_prompt, "model_max_length": L}, open(out + "/case.json", "w"))
