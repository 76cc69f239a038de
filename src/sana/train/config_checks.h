// The config checks that need the model's or the data's knowledge (config/ knows neither):
// the preset list as the choices of model.model, the preset's shape against the model
// keys, and every bucket against the model's cell. Torch-free. Call register_checks()
// once at start-up, before any config is loaded (main does; so does the tests' main).
#pragma once

namespace sana {

void register_checks();

}  // namespace sana
