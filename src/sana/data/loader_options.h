// What a data loader is built with (data/loader.h): its share of each step, workers,
// decoding and features. Plain data, no torch: train/options/core_options.h fills in the
// run's settings, the caller its rank, world size and micro-batch.
#pragma once

#include <cstdint>
#include <memory>

#include "sana/data/control_maps.h"
#include "sana/data/decode.h"
#include "sana/data/sample_cache.h"
#include "sana/data/sample_meta.h"

namespace sana::data {

class Dataset;

struct LoaderOptions {
  int rank = 0;
  int world_size = 1;
  int64_t micro_batch = 1;
  int workers = 2;
  int prefetch = 4;           // micro-batches decoded ahead
  bool pin_memory = false;    // page-locked host memory for fast copies to CUDA
  bool random_flip = false;
  bool whole_micro_batches = false;  // train.deterministic: shares of whole micro-batches (rank_share_whole)
  uint64_t seed = 0;
  DecodeOptions decode;
  // ControlNet runs: each batch carries the control maps of its images (Batch::control).
  ControlMapOptions control;
  // train.masked_loss: each batch carries its samples' loss masks (Batch::masks).
  bool masks = false;
  // ... and a sample without a mask file takes its image's alpha channel (train.masked_loss_alpha).
  bool alpha_masks = false;
  // data.class_data_dir: the class images (Batch::prior_images); null: none. Sample s of
  // epoch e trains beside class image (e x the dataset's size + s) mod the class set's size.
  const Dataset* prior = nullptr;
  uint64_t prior_count = 0;  // of its samples, the first this many (data.num_class_images; 0: all)
  // Which of a sample's captions each batch carries, drawn per (seed, epoch, sample).
  CaptionChoice caption;
  std::shared_ptr<SampleCache> cache;  // data.cache: decoded bucket images (null: none)
  double wait_timeout_s = 300;  // a decode stuck this long is an error, not a hang
  double stop_wait_s = 10;      // the destructor waits this long for a worker inside a read
  // Precomputed features instead of pixels (data.load_vae_feat / data.load_text_feat).
  bool load_latents = false;
  int64_t latent_channels = 32;    // vae.vae_latent_dim
  int64_t latent_downsample = 32;  // vae.vae_downsample_rate: bucket h, w / this
  bool load_text_feat = false;
  int64_t text_length = 300;       // text_encoder.model_max_length (padded to; longer is a bad sample)
  int64_t text_channels = 2304;    // text_encoder.caption_channels
};

}  // namespace sana::data
