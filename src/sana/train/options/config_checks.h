// The config checks that need the model's or the data's knowledge (config/ knows neither):
// the preset list as the choices of model.model, the preset's shape against the model
// keys, and every bucket against the model's cell. Torch-free. Call register_checks()
// once at start-up, before any config is loaded (main does; so does the tests' main).
#pragma once

namespace sana {

void register_checks();

namespace train {
// Registers the config check of train.lora (config/checks.h): every target must select a
// layer LoRA can adapt in the config's model (built on the meta device), so a mistake exits
// 2 naming the key before anything starts. Call once at start-up, as register_checks().
// Defined in lora_config_check.cpp (the torch side).
void register_lora_check();
}  // namespace train

}  // namespace sana
