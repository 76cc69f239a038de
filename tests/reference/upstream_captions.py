"""Upstream's data filters and caption choice, for tests/apps/upstream_captions.sh.

  upstream_captions.py make DIR
      writes a dataset in upstream Sana's WebDataset layout (DIR/wids-meta.json, two tar
      shards of PNG + .json samples) with the files upstream reads beside each shard:
      <shard>_prompt_clip_score.json (shard 0 only: shard 1's samples score 100 upstream),
      external captions <shard>_VILA.json (entries with "prompt") and <shard>_extra.json
      (entries without), and CLIP scores <shard>_clip_score.json.
  upstream_captions.py check DIR SETTINGS.json DUMP.tsv [DUMP.tsv ...]
      checks check-data dumps (one per seed) against upstream's rules for SETTINGS (the data.*
      keys the run had): the samples kept are exactly those upstream's sampler keeps, each
      dumped caption is one upstream can pick, and over all draws the most likely caption
      comes up as often as upstream's probabilities say (within 4 standard deviations, for each
      group of samples whose captions have the same probabilities).

The rules are transcribed from NVlabs/Sana: get_data_info of SanaWebDataset and the filter of
AspectRatioBatchSampler._get_data_info_and_ratio (diffusion/data/datasets/sana_data.py,
diffusion/utils/data_sampler.py), getdata's caption merge and weighted_sample_clipscore /
weighted_sample_fix_prob of SanaWebDatasetMS (sana_data_multi_scale.py, sana_data.py). Instead
of drawing with Python's random they give each caption's probability. One documented
difference: upstream also drops a sample missing from an existing _prompt_clip_score.json
when del_img_clip_thr is 0; sana-train drops it only under a threshold (docs/upstream.md)."""
import csv
import io
import json
import math
import os
import sys
import tarfile

import numpy as np
from PIL import Image

N, SHARDS = 240, 2


def key_of(i):
    return f"{i:08d}"


def size_of(i):
    return (64, 64) if i % 2 == 0 else (48, 96)  # height, width: two ASPECT_RATIO_256 buckets at 256


def make(d):
    os.makedirs(d, exist_ok=True)
    per = N // SHARDS
    shards = []
    for s in range(SHARDS):
        stem = os.path.join(d, f"{s:05d}")
        prompt_clip, vila, extra, clip = {}, {}, {}, {}
        with tarfile.open(stem + ".tar", "w") as tar:
            for i in range(s * per, (s + 1) * per):
                k = key_of(i)
                h, w = size_of(i)
                info = {"prompt": f"prompt {k}", "width": w * 4, "height": h * 4}
                if i % 3 == 0:
                    info["version"] = "high_quality"
                elif i % 3 == 1:
                    info["version"] = "others"
                img = Image.new("RGB", (w * 4, h * 4), ((i * 37) % 256, (i * 11) % 256, 90))
                buf = io.BytesIO()
                img.save(buf, "PNG")
                for name, payload in ((f"{k}.png", buf.getvalue()), (f"{k}.json", json.dumps(info).encode())):
                    t = tarfile.TarInfo(name)
                    t.size = len(payload)
                    tar.addfile(t, io.BytesIO(payload))
                if i % 10 != 9:  # some samples are missing from the prompt score file
                    prompt_clip[k] = {"prompt": 0.0 if i % 17 == 0 else 15 + (i * 7) % 20}
                if i % 5 != 4:
                    vila[k] = {"prompt": None if i % 11 == 3 else f"vila {k}"}
                if i % 4 != 1:
                    extra[k] = {"internvl": f"internvl {k}"}
                profile = i % 4
                if profile == 0:
                    clip[k] = {"prompt": 20, "_VILA": 40, "internvl": 26, "ghost": 50}
                elif profile == 1:
                    clip[k] = {"prompt": 20, "_VILA": 24, "internvl": 22}
                elif profile == 2:
                    clip[k] = {"prompt": 27, "_VILA": 27.0, "internvl": 10}
                else:
                    clip[k] = {"prompt": "31.5", "internvl": 12}
        if s == 0:
            json.dump(prompt_clip, open(stem + "_prompt_clip_score.json", "w"))
        json.dump(vila, open(stem + "_VILA.json", "w"))
        json.dump(extra, open(stem + "_extra.json", "w"))
        json.dump(clip, open(stem + "_clip_score.json", "w"))
        shards.append({"url": f"{s:05d}.tar", "nsamples": per, "filesize": os.path.getsize(stem + ".tar")})
    json.dump({"name": "captions", "__kind__": "SANA-WebDataset", "wids_version": 1, "shardlist": shards},
              open(os.path.join(d, "wids-meta.json"), "w"))
    print(f"wrote {N} samples in {SHARDS} shards to {d}")


def load(path):
    return json.load(open(path)) if os.path.exists(path) else None


def upstream_view(d, i, settings):
    """(kept, {caption text: probability}) for sample i, by upstream's rules."""
    s = i // (N // SHARDS)
    stem = os.path.join(d, f"{s:05d}")
    k = key_of(i)
    with tarfile.open(stem + ".tar") as tar:
        info = json.load(tar.extractfile(f"{k}.json"))
    # get_data_info + the sampler's filter
    version = info.get("version", "others")
    pc = load(stem + "_prompt_clip_score.json")
    if pc is not None and k not in pc:
        clip = None  # upstream: get_data_info fails, the sample is skipped
    else:
        clip = float(pc[k]["prompt"]) if pc is not None else 100
    if settings["hq_only"] and version not in ["high_quality"]:
        return False, None
    thr = settings["del_img_clip_thr"]
    if thr > 0 and (clip is None or (clip and clip < thr)):
        return False, None
    # getdata's merge (SanaWebDatasetMS)
    for suffix in settings["external_caption_suffixes"]:
        ext = load(stem + suffix + ".json") or {}
        if k in ext:
            if "prompt" in ext[k]:
                info.update({suffix.replace(".", "_"): ext[k]["prompt"]})
            else:
                info.update(ext[k])
    if settings["caption_selection_type"] == "proportion":
        names = list(settings["caption_proportion"].keys())
        weights = np.array(list(settings["caption_proportion"].values()), dtype=float)
        probs = {}
        for n, p in zip(names, weights / weights.sum()):
            probs[n] = probs.get(n, 0) + p
    else:
        labels, weights, fallback, best = [], [], None, float("-inf")
        for suffix in settings["external_clipscore_suffixes"]:
            scores = (load(stem + suffix + ".json") or {}).get(k, {})
            for ct, cs in scores.items():
                cs = float(cs)
                if ct in info:
                    if cs >= settings["clip_thr"]:
                        labels.append(ct)
                        weights.append(cs)
                    if cs > best:
                        best, fallback = cs, ct
        if not labels and fallback:
            probs = {fallback: 1.0}
        elif not labels:
            probs = {"prompt": 1.0}
        else:
            adj = np.array(weights) ** (1.0 / max(settings["clip_thr_temperature"], 0.01))
            probs = {}
            for ct, p in zip(labels, adj / adj.sum()):
                probs[ct] = probs.get(ct, 0) + p
    texts = {}
    for ct, p in probs.items():
        text = info["prompt"] if ct not in info else ("" if info[ct] is None else info[ct])
        texts[text] = texts.get(text, 0) + p
    return True, texts


def check(d, settings_file, dumps):
    settings = json.load(open(settings_file))
    expected = {key_of(i): upstream_view(d, i, settings) for i in range(N)}
    kept = {k for k, (keep, _) in expected.items() if keep}
    failures = []
    groups = {}  # samples with the same probabilities: draws, hits of the most likely, mean, variance
    for dump in dumps:
        rows = list(csv.DictReader(open(dump), delimiter="\t"))
        got = [r["path"].split("#")[1].split(".")[0] for r in rows]
        if set(got) != kept or len(got) != len(kept):
            failures.append(f"{dump}: {len(got)} samples dumped, upstream keeps {len(kept)}; "
                            f"extra {sorted(set(got) - kept)[:5]}, missing {sorted(kept - set(got))[:5]}")
            continue
        for k, r in zip(got, rows):
            texts = expected[k][1]
            caption = r["caption"]
            if texts.get(caption, 0) <= 0:
                failures.append(f"{dump}: sample {k} got caption {caption!r}; upstream picks from {texts}")
                continue
            top = max(texts.items(), key=lambda t: (t[1], t[0]))
            g = groups.setdefault(tuple(sorted(round(p, 9) for p in texts.values())), [0, 0, 0.0, 0.0])
            g[0] += 1
            g[1] += caption == top[0]
            g[2] += top[1]
            g[3] += top[1] * (1 - top[1])
    for probs, (draws, hits, mean, var) in sorted(groups.items()):
        if abs(hits - mean) > 4 * math.sqrt(var) + 1e-9:
            failures.append(f"samples whose captions have probabilities {probs}: the most likely came up {hits} "
                            f"times in {draws} draws; upstream's probabilities give {mean:.1f} +- {math.sqrt(var):.1f}")
    for f in failures[:10]:
        print("FAIL", f)
    if failures:
        sys.exit(1)
    random_groups = [g for p, g in groups.items() if len(p) > 1]
    print(f"ok: {len(kept)} of {N} samples kept as upstream keeps them; {sum(g[0] for g in groups.values())} "
          f"captions drawn, {sum(g[0] for g in random_groups)} of them among several; the most likely "
          f"{sum(g[1] for g in random_groups)} times (upstream's probabilities: "
          f"{sum(g[2] for g in random_groups):.1f} +- {math.sqrt(sum(g[3] for g in random_groups)):.1f})")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4:])
