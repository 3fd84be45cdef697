// Finds a model given a local directory or a Hugging Face repo id already in the local hub
// cache. Never touches the network.
#pragma once
#include <string>

namespace mt {

// An existing directory is returned as is. "Org/Name" is looked up in $HF_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub, as
// models--Org--Name/snapshots/<refs/main> (or the only snapshot when refs/main is absent).
// mt::Error lists the places looked at.
std::string hf_resolve_model_path(const std::string& path_or_repo_id);

}  // namespace mt
