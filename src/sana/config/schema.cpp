#include "sana/config/schema.h"

#include <fmt/format.h>

#include <set>
#include <type_traits>

#include "sana/config/checks.h"
#include "sana/config/schema_section.h"
#include "sana/config/upstream.h"

namespace sana::config {

namespace {

void describe_data(std::vector<Field>& f, DataConfig& d) {
  Section s(f, "data");
  s.add("data_dir", d.data_dir, "image folders, JSONL/CSV metadata files or dataset indexes")
      .commonly_used();
  s.add("image_size", d.image_size, "base resolution in pixels").at_least(8).commonly_used();
  s.add("aspect_ratio_type", d.aspect_ratio_type,
        "bucket table: upstream's ASPECT_RATIO_<size> or 'generated' (any size, bucket_step)")
      .one_of({"ASPECT_RATIO_256", "ASPECT_RATIO_512", "ASPECT_RATIO_1024", "ASPECT_RATIO_2048",
               "ASPECT_RATIO_2880", "ASPECT_RATIO_4096", "generated"});
  s.add("multi_scale_sizes", d.multi_scale_sizes, "further base sizes trained in the same run")
      .at_least(8);
  s.add("bucket_step", d.bucket_step, "pixel step of generated bucket tables").at_least(1);
  s.add("multi_scale_rule", d.multi_scale_rule,
        "base size of a sample: the largest not above its native size, the nearest, or the largest")
      .one_of({"largest_fitting", "nearest", "largest"});
  s.add("tail", d.tail, "last partial global batch of a bucket: drop or pad");
  s.add("sampler", d.sampler,
        "bucket: the epoch plan; distributed: torch's DistributedSampler (single resolution)");
  s.add("interpolation", d.interpolation,
        "resize filter, computed as PIL's: upstream = bicubic, lanczos for the 2048 and 2880 tables (as "
        "upstream's datasets); area is PIL's box filter")
      .one_of({"upstream", "area", "bilinear", "bicubic", "lanczos"});
  s.add("jpeg_reduced_decode", d.jpeg_reduced_decode,
        "decode large JPEGs at 1/2, 1/4 or 1/8 scale when that still covers the bucket: faster, slightly "
        "different pixels (README: PSNR against the default)");
  s.add("exif_orientation", d.exif_orientation,
        "turn images as their EXIF orientation says; upstream's PIL pipeline ignores it");
  s.add("max_bad_fraction", d.max_bad_fraction,
        "fraction of bad samples tolerated; beyond it all ranks stop together")
      .at_least(0)
      .at_most(1);
  s.add("max_untrained_fraction", d.max_untrained_fraction,
        "share of the samples allowed in buckets no epoch trains (smaller than a global batch with tail "
        "drop); beyond it training refuses to start")
      .at_least(0)
      .at_most(1);
  s.add("prefetch_batches", d.prefetch_batches, "batches decoded ahead per process").at_least(1);
  s.add("random_flip", d.random_flip, "random horizontal flips (per-sample stream)");
  s.add("cache", d.cache,
        "keep each decoded bucket image (before the flip) for later epochs: memory (shared memory, this "
        "run) or disk (a file in data.cache_dir that later runs reuse)");
  s.add("cache_max_gb", d.cache_max_gb, "the most data.cache may hold per node, in GiB").at_least(0);
  s.add("cache_dir", d.cache_dir,
        "data.cache: disk: a folder on a local disk of each node; empty = work_dir/sample_cache");
  s.add("load_vae_feat", d.load_vae_feat, "read precomputed latents instead of images");
  s.add("load_text_feat", d.load_text_feat, "read precomputed caption features");
  s.add("hq_only", d.hq_only, "only samples whose .json says \"version\": \"high_quality\" (upstream's layout)");
  s.add("del_img_clip_thr", d.del_img_clip_thr,
        "leave out samples whose prompt CLIP score (<shard>_prompt_clip_score.json) is below this; 0 = keep all");
  s.add("caption_selection_type", d.caption_selection_type,
        "clipscore: draw among captions scoring clip_thr or more; proportion: by caption_proportion")
      .one_of({"clipscore", "proportion"});
  s.add("caption_proportion", d.caption_proportion, "proportion: caption name -> weight").at_least(0);
  s.add("external_caption_suffixes", d.external_caption_suffixes,
        "further captions from <shard><suffix>.json beside each wids shard");
  s.add("external_clipscore_suffixes", d.external_clipscore_suffixes,
        "captions' CLIP scores from <shard><suffix>.json beside each wids shard");
  s.add("clip_thr", d.clip_thr, "clipscore: captions scoring at least this are candidates");
  s.add("clip_thr_temperature", d.clip_thr_temperature,
        "clipscore: candidate weight score^(1/temperature) (temperature at least 0.01)");
}

void describe_model(std::vector<Field>& f, ModelConfig& m) {
  Section s(f, "model");
  s.add("model", m.model, "model preset name").one_of(registered_choices("model.model")).commonly_used();
  s.add("image_size", m.image_size, "resolution the model is built for (= data.image_size)")
      .at_least(8);
  s.add("mixed_precision", m.mixed_precision, "autocast dtype on CUDA (CPU runs in fp32)");
  s.add("fp32_attention", m.fp32_attention, "linear attention in fp32 under autocast");
  s.add("load_from", m.load_from, "initial weights (a local checkpoint), before training")
      .commonly_used();
  s.add("multi_scale", m.multi_scale, "train on aspect-ratio buckets");
  s.add("attn_type", m.attn_type, "self-attention kind").one_of({"linear"});
  s.add("linear_head_dim", m.linear_head_dim, "channels per linear-attention head").at_least(1);
  s.add("ffn_type", m.ffn_type, "feed-forward kind").one_of({"glumbconv"});
  s.add("mlp_ratio", m.mlp_ratio, "feed-forward hidden size / model width").above(0);
  s.add("qk_norm", m.qk_norm, "RMSNorm on the self-attention's queries and keys (SANA-1.5)");
  s.add("cross_norm", m.cross_norm, "RMSNorm on the cross-attention's queries and keys (SANA-1.5)");
  s.add("use_pe", m.use_pe, "add a fixed 2-D sin-cos position embedding to the patch tokens");
  s.add("pe_interpolation", m.pe_interpolation, "use_pe: grid scale of the embedding").above(0);
  s.add("class_dropout_prob", m.class_dropout_prob, "caption/class dropout for guidance")
      .at_least(0)
      .at_most(1);
  s.add("load_strict", m.load_strict,
        "load_from: refuse missing, unexpected or mis-shaped tensors (false: load what fits, report the rest)");
  s.add("num_classes", m.num_classes,
        "without captions: >0 conditions on the data's class labels, 0 trains unconditionally")
      .at_least(0);
}

void describe_vae(std::vector<Field>& f, VaeConfig& v) {
  Section s(f, "vae");
  s.add("vae_type", v.vae_type,
        "'none' trains in pixel space; 'torchscript' or 'dc-ae' loads vae_pretrained");
  s.add("vae_pretrained", v.vae_pretrained, "TorchScript VAE file (encode, optionally decode)");
  s.add("scale_factor", v.scale_factor, "latent scale factor").above(0);
  s.add("vae_latent_dim", v.vae_latent_dim, "latent channels").at_least(1);
  s.add("vae_downsample_rate", v.vae_downsample_rate, "pixels per latent cell").at_least(1);
  s.add("tile_size", v.tile_size,
        "encode images larger than this in tiles of this many pixels (a multiple of vae_downsample_rate; 0 = whole "
        "images), for memory (online encoding and prepare-features)")
      .at_least(0);
  s.add("tile_overlap", v.tile_overlap,
        "pixels neighbouring tiles share, blended (a multiple of vae_downsample_rate, less than tile_size)")
      .at_least(0);
}

void describe_text_encoder(std::vector<Field>& f, TextEncoderConfig& t) {
  Section s(f, "text_encoder");
  s.add("text_encoder_name", t.text_encoder_name,
        "'none' (class labels or unconditional), 'torchscript' or an upstream encoder name "
        "(runs text_encoder_path)")
      .one_of(text_encoder_names());
  s.add("text_encoder_path", t.text_encoder_path,
        "TorchScript text encoder: forward(prompts) -> (features, mask), or forward(ids, mask) with tokenizer_path");
  s.add("tokenizer_path", t.tokenizer_path,
        "SentencePiece tokenizer.model: captions tokenized here as upstream (CHI prompt, token selection)");
  s.add("null_embed_path", t.null_embed_path,
        "the empty prompt's features without a text encoder (upstream's null_embed_diffusers_*.pth); '' = "
        "upstream's file under train.null_embed_root if it exists");
  s.add("caption_channels", t.caption_channels, "caption feature width").at_least(1);
  s.add("model_max_length", t.model_max_length, "caption tokens").at_least(1);
  s.add("y_norm", t.y_norm, "RMSNorm on caption features");
  s.add("y_norm_scale_factor", t.y_norm_scale_factor, "initial RMSNorm weight").above(0);
  s.add("chi_prompt", t.chi_prompt, "instruction lines put before every caption (Sana's CHI)");
}

void describe_scheduler(std::vector<Field>& f, SchedulerConfig& sc) {
  Section s(f, "scheduler");
  s.add("train_sampling_steps", sc.train_sampling_steps, "timestep resolution").at_least(1);
  s.add("predict_flow_v", sc.predict_flow_v, "predict the flow velocity (noise - data)");
  s.add("noise_schedule", sc.noise_schedule, "noise schedule").one_of({"linear_flow"});
  s.add("flow_shift", sc.flow_shift, "timestep shift towards noise").above(0).commonly_used();
  s.add("weighting_scheme", sc.weighting_scheme,
        "timestep density: logit_normal, uniform, or sd3_mode (SD3's mode density); upstream's 'mode' reads as "
        "uniform, as its train.py draws it");
  s.add("logit_mean", sc.logit_mean, "mean of the logit-normal timestep density");
  s.add("logit_std", sc.logit_std, "std of the logit-normal timestep density").above(0);
  s.add("mode_scale", sc.mode_scale, "scale of the sd3_mode timestep density");
  s.add("timestep_grid", sc.timestep_grid,
        "integer: upstream's 1/1000 grid and integer model timesteps; continuous: any sigma");
  s.add("vis_sampler", sc.vis_sampler, "sampler for preview images")
      .one_of({"flow_euler", "flow_dpm-solver"});
}

// What a run shows while it trains: log lines, TensorBoard, previews.
void describe_dist(std::vector<Field>& f, DistConfig& d) {
  Section s(f, "dist");
  s.add("backend", d.backend, "collective backend");
  s.add("device", d.device, "device kind");
  s.add("master_addr", d.master_addr, "rendezvous host (default: the launcher's)");
  s.add("master_port", d.master_port, "rendezvous port; 0 = the launcher's or 29500")
      .at_least(0)
      .at_most(65535);
  s.add("timeout_s", d.timeout_s, "limit of every collective and store wait, seconds")
      .above(0)
      .commonly_used();
  s.add("heartbeat_timeout_s", d.heartbeat_timeout_s,
        "a rank silent this long is declared dead (capped by timeout_s)")
      .above(0);
  s.add("socket_ifname", d.socket_ifname, "network interface for Gloo (GLOO_SOCKET_IFNAME)");
  s.add("allow_shared_device", d.allow_shared_device,
        "debugging only: let several ranks share one GPU (needs backend gloo)");
  s.add("threads_per_process", d.threads_per_process,
        "CPU threads per process; 0 = cores / processes on the host")
      .at_least(0);
}

void describe_ddp(std::vector<Field>& f, DdpConfig& d) {
  Section s(f, "ddp");
  s.add("bucket_cap_mb", d.bucket_cap_mb, "gradient bucket size (MiB) of the overlapped all-reduce")
      .above(0);
  s.add("broadcast_buffers", d.broadcast_buffers,
        "copy rank 0's buffers to every rank at each step start (never inside a forward)");
}

void describe_model_growth(std::vector<Field>& f, ModelGrowthConfig& g) {
  Section s(f, "model_growth");
  s.add("pretrained_ckpt_path", g.pretrained_ckpt_path,
        "SANA-1.5 model growth: the shallower model's weights (safetensors or torch.save'd); '' = none");
  s.add("init_strategy", g.init_strategy, "how the new blocks start (upstream's model_growth_utils.py)")
      .one_of({"cyclic", "block_expand", "progressive", "interpolation", "random", "constant"});
  s.add("source_num_layers", g.source_num_layers, "blocks taken from the checkpoint (its first N)").at_least(1);
  s.add("target_num_layers", g.target_num_layers, "blocks of the grown model: model.model's depth").at_least(1);
  Section p(f, "model_growth.init_params");
  p.add("expand_ratio", g.init_params.expand_ratio, "block_expand: new blocks per source block").at_least(1);
  p.add("noise_scale", g.init_params.noise_scale, "progressive: std of the noise added to the copied block")
      .at_least(0);
  p.add("zero_gate", g.init_params.zero_gate,
        "cyclic, block_expand: repeated blocks start with zero output projections and modulation");
  p.add("scale_spec", g.init_params.scale_spec, "constant: std of the new blocks' output projections").at_least(0);
  p.add("scale_others", g.init_params.scale_others, "constant: std of the new blocks' other weights").at_least(0);
}

void describe_controlnet(std::vector<Field>& f, ControlNetConfig& c) {
  Section s(f, "controlnet");
  s.add("control_signal_type", c.control_signal_type,
        "ControlNet presets: the control map of each sample (canny: OpenCV's edges of its image; scribble, hed: "
        "upstream's HED scribbles or soft edges of it, with controlnet.hed_model; dataset: the control image its "
        "JSONL/CSV `control` field names)");
  s.add("canny_low_threshold", c.canny_low_threshold, "canny: the lower hysteresis threshold").at_least(0).at_most(1000);
  s.add("canny_high_threshold", c.canny_high_threshold, "canny: the upper hysteresis threshold")
      .at_least(0)
      .at_most(1000);
  s.add("hed_model", c.hed_model,
        "scribble, hed: upstream's HED network (lllyasviel's ControlNetHED.pth) exported to TorchScript by "
        "scripts/export_hed.py");
  s.add("detect_resolution", c.detect_resolution, "scribble, hed: the short side the network sees (upstream's 512)")
      .at_least(64)
      .at_most(4096);
  s.add("scribble_thickness", c.scribble_thickness,
        "scribble: line thickness 0-24; -1 draws it per sample and epoch from 0-24, as upstream's get_scribble_map")
      .at_least(-1)
      .at_most(24);
  s.add("validation_scribble_maps", c.validation_scribble_maps,
        "control images for the previews (maps, not photos); none: the maps of the dataset's first samples");
  s.add("conditioning_scale", c.conditioning_scale, "previews: the weight of the control's injection (1 = as trained)")
      .at_least(0);
}

void describe_ckpt(std::vector<Field>& f, CkptConfig& c) {
  Section s(f, "ckpt");
  s.add("keep_last_n", c.keep_last_n, "checkpoints kept; 0 keeps all").at_least(0);
  s.add("async_save", c.async_save, "write checkpoints on a background thread");
  s.add("save_ema", c.save_ema, "include the EMA weights");
  s.add("save_optimizer", c.save_optimizer, "include the optimizer state");
  s.add("format", c.format,
        "3: every process writes and reads its own share of each checkpoint (docs/checkpoints.md); "
        "2: process 0 writes one file per part")
      .at_least(2)
      .at_most(3);
}

}  // namespace

std::vector<Field> fields_of(Config& c) {
  std::vector<Field> f;
  Section top(f, "");
  top.add("work_dir", c.work_dir, "output folder: logs, checkpoints, previews").commonly_used();
  top.add("resume_from", c.resume_from, "'latest' or a checkpoint folder to resume").commonly_used();
  top.add("log_level", c.log_level, "log verbosity").one_of({"debug", "info", "warn", "error"});
  top.add("log_console", c.log_console,
          "training's terminal: 'rank0' shows rank 0's lines and every rank's warnings and errors "
          "(each rank's full log is in work_dir), 'all' every rank's lines")
      .one_of({"rank0", "all"});
  describe_data(f, c.data);
  describe_model(f, c.model);
  describe_vae(f, c.vae);
  describe_text_encoder(f, c.text_encoder);
  describe_scheduler(f, c.scheduler);
  describe_train(f, c.train);
  describe_dist(f, c.dist);
  describe_ddp(f, c.ddp);
  describe_ckpt(f, c.ckpt);
  describe_model_growth(f, c.model_growth);
  describe_controlnet(f, c.controlnet);
  return f;
}

bool ChoiceRef::set_name(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) {
      set(target, i);
      return true;
    }
  }
  return false;
}

std::vector<std::string> section_keys(const std::vector<Field>& fields) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& field : fields) {
    for (size_t dot = field.key.find('.'); dot != std::string::npos;
         dot = field.key.find('.', dot + 1)) {
      std::string prefix = field.key.substr(0, dot);
      if (seen.insert(prefix).second) out.push_back(prefix);
    }
  }
  return out;
}

}  // namespace sana::config
