// SANA-Sprint's keys (docs/sprint.md), at upstream's places in the model, scheduler and
// train sections: the student's extra heads, stage 2's teacher, discriminator and objective.
#include "sana/config/schema_section.h"

namespace sana::config {

void describe_sprint_model(Section& s, SprintModelConfig& m) {
  s.add("cfg_embed", m.cfg_embed,
        "SANA-Sprint's student: embed each sample's guidance scale (x cfg_embed_scale) like the timestep and add "
        "it to the time embedding (cfg_embedder)");
  s.add("cfg_embed_scale", m.cfg_embed_scale, "cfg_embed: the guidance scale's factor before its embedding")
      .above(0);
  s.add("logvar", m.logvar, "SANA-Sprint's student: a log-variance head on the time embedding (logvar_linear) "
        "that weighs the sCM loss");
  s.add("teacher", m.teacher, "SANA-Sprint stage 2: the teacher's preset ('' = model.model's architecture)");
  s.add("teacher_model", m.teacher_model,
        "SANA-Sprint stage 2: the teacher's weights (the stage-1 fine-tune: upstream's .pth or a safetensors file)");
  s.add("ladd_multi_scale", m.ladd_multi_scale,
        "head_block_ids []: heads on blocks 2, 8, 14, 20, 27 (true) or on the last block only (false), as "
        "upstream");
  s.add("head_block_ids", m.head_block_ids,
        "SANA-Sprint stage 2: the teacher blocks whose outputs the discriminator heads read, ascending")
      .at_least(0);
}

void describe_sprint_scheduler(Section& s, SprintSchedulerConfig& sc) {
  s.add("sigma_data", sc.sigma_data, "SANA-Sprint stage 2: the data scale of TrigFlow (latents x sigma_data)")
      .above(0);
  s.add("logit_mean_discriminator", sc.logit_mean_discriminator,
        "SANA-Sprint stage 2: the discriminator's re-noising times, atan(exp(N(mean, std)) / 0.5)");
  s.add("logit_std_discriminator", sc.logit_std_discriminator, "the std of those times").above(0);
  s.add("weighting_scheme_discriminator", sc.weighting_scheme_discriminator,
        "the density of the discriminator's times (only logit_normal_trigflow, upstream's default)");
}

void describe_sprint_train(Section& s, SprintTrainConfig& t) {
  s.add("tangent_warmup_steps", t.tangent_warmup_steps,
        "SANA-Sprint stage 2: the sCM tangent's weight rises from 0 to 1 over these steps (both phases count)")
      .at_least(1);
  s.add("scm_cfg_scale", t.scm_cfg_scale,
        "the teacher's guidance scales, one drawn per sample and step (also the student's cfg_embed input)")
      .at_least(0);
  s.add("scm_loss", t.scm_loss, "the sCM loss in the generator's phase (false is not built)");
  s.add("scm_lambda", t.scm_lambda, "the sCM loss's weight in the generator's phase").at_least(0);
  s.add("adv_lambda", t.adv_lambda, "the adversarial loss's weight in the generator's phase").at_least(0);
  s.add("misaligned_pairs_D", t.misaligned_pairs_D,
        "the discriminator also sees each caption with the previous sample's latent, as a fake");
  s.add("discriminator_loss", t.discriminator_loss, "hinge (upstream's Sprint YAMLs; 'cross entropy' is not built)");
  s.add("train_largest_timestep", t.train_largest_timestep,
        "the student's x0 for the discriminator comes from a fresh time, largest_timestep with largest_timestep_prob");
  s.add("largest_timestep", t.largest_timestep, "that time (TrigFlow, pi/2 = pure noise)").above(0).at_most(1.5708);
  s.add("largest_timestep_prob", t.largest_timestep_prob, "its probability").at_least(0).at_most(1);
  s.add("diff_timesteps_D", t.diff_timesteps_D, "real and fake latents re-noised at independent times");
}

}  // namespace sana::config
