// Where a model a config names lives on this machine: a local folder, or a Hugging Face hub
// name (ORG/NAME, as upstream's YAMLs give them) already downloaded. sana-train never
// downloads; it looks, in this order, in
//   1. $SANA_MODELS_DIR/ORG/NAME, then $SANA_MODELS_DIR/NAME (a folder of plain copies);
//   2. the Hugging Face cache, as huggingface_hub lays it out: $HF_HUB_CACHE, else
//      $HF_HOME/hub, else ~/.cache/huggingface/hub; in it models--ORG--NAME/snapshots/REV/,
//      REV the commit refs/main names (the newest snapshot when there is no refs/main).
// No torch here: config validation resolves names before anything trains.
#pragma once

#include <string>
#include <vector>

namespace sana::hub {

struct Lookup {
  std::string folder;                  // "" when not found
  std::vector<std::string> looked_in;  // every place tried, in order (for the error)
};

// `name`: an existing local folder (returned as it is), or a hub name ORG/NAME.
Lookup find_model(const std::string& name);

// Whether `name` has a hub name's shape: ORG/NAME, neither starting with '.' or '/'.
bool is_hub_name(const std::string& name);

// The one command that puts `hub_name` where find_model() looks.
std::string download_command(const std::string& hub_name);

// "'NAME' is not on this machine: looked in A, B; download it with CMD (or give a local
// folder)", for an error naming the key that gave it.
std::string not_found_text(const std::string& name, const Lookup& lookup);

}  // namespace sana::hub
