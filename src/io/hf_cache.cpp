#include "io/hf_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "io/json_text.h"

namespace fs = std::filesystem;

namespace mt {

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// huggingface_hub's precedence for the hub cache directory.
std::string hub_cache_dir() {
  if (auto v = env_or_empty("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env_or_empty("HF_HOME"); !v.empty()) return v + "/hub";
  if (auto v = env_or_empty("XDG_CACHE_HOME"); !v.empty()) return v + "/huggingface/hub";
  return env_or_empty("HOME") + "/.cache/huggingface/hub";
}

bool is_plain_component(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos && s.front() != '.';
}

bool looks_like_repo_id(const std::string& s) {
  auto slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return false;
  return is_plain_component(s.substr(0, slash)) && is_plain_component(s.substr(slash + 1));
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  auto e = s.find_last_not_of(ws);
  s.erase(e == std::string::npos ? 0 : e + 1);
  return s;
}

}  // namespace

std::string hf_resolve_model_path(const std::string& path_or_repo_id) {
  std::error_code ec;
  if (fs::is_directory(path_or_repo_id, ec)) return path_or_repo_id;
  if (fs::exists(path_or_repo_id, ec)) fail("model path {} exists but is not a directory", path_or_repo_id);
  if (!looks_like_repo_id(path_or_repo_id))
    fail("model {}: no such directory, and not an Org/Name repo id to look up in the Hugging Face cache",
         path_or_repo_id);

  const std::string slash_free = "models--" + path_or_repo_id.substr(0, path_or_repo_id.find('/')) + "--" +
                                 path_or_repo_id.substr(path_or_repo_id.find('/') + 1);
  const std::string repo_dir = hub_cache_dir() + "/" + slash_free;
  const std::string ref_file = repo_dir + "/refs/main";
  const std::string snapshots = repo_dir + "/snapshots";
  if (!fs::is_directory(repo_dir, ec))
    fail("model {}: not a local directory, and not in the Hugging Face cache (looked at ./{} and {}; set "
         "HF_HUB_CACHE or HF_HOME, or download it first)",
         path_or_repo_id, path_or_repo_id, repo_dir);

  if (fs::exists(ref_file, ec)) {
    std::ifstream in(ref_file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string hash = trim(ss.str());
    if (!is_plain_component(hash)) fail("model {}: {} holds {}, not a snapshot hash", path_or_repo_id, ref_file, json_quote_short(hash));
    const std::string snap = snapshots + "/" + hash;
    if (!fs::is_directory(snap, ec))
      fail("model {}: {} names snapshot {} but {} is missing", path_or_repo_id, ref_file, hash, snap);
    return snap;
  }
  std::vector<std::string> found;
  for (auto it = fs::directory_iterator(snapshots, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->is_directory()) found.push_back(it->path().string());
  if (found.size() == 1) return found[0];
  fail("model {}: no {} and {} snapshots in {} (expected exactly one)", path_or_repo_id, ref_file, found.size(),
       snapshots);
}

}  // namespace mt
