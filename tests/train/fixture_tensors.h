// Test-only reader for the safetensors fixtures written by Python (tests/fixtures/): a few
// lines so the model and optimizer tests do not depend on src/io.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::test {

inline std::map<std::string, Tensor> fixture_tensors_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  nlohmann::json h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<long>(n));
  std::map<std::string, Tensor> r;
  for (auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    Shape shape = info["shape"].get<Shape>();
    DType dt = dtype_from_safetensors_name(info["dtype"].get<std::string>()).value();
    Tensor t = Tensor::empty(shape, dt);
    uint64_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
    if (end - begin != t.nbytes()) throw std::runtime_error("bad offsets for " + name);
    std::memcpy(t.data(), b.data() + 8 + n + begin, t.nbytes());
    r[name] = t;
  }
  return r;
}

// Every tensor of a checkpoint directory (model.safetensors.index.json + shards), with the
// shard file of each name.
struct FixtureCheckpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> shard_of;
};

inline FixtureCheckpoint fixture_checkpoint_read(const std::string& dir) {
  std::ifstream f(dir + "/model.safetensors.index.json");
  nlohmann::json idx = nlohmann::json::parse(f);
  FixtureCheckpoint c;
  std::map<std::string, bool> files;
  for (auto& [name, file] : idx["weight_map"].items()) {
    c.shard_of[name] = file.get<std::string>();
    files[file.get<std::string>()] = true;
  }
  for (auto& [file, unused] : files)
    for (auto& [name, t] : fixture_tensors_read(dir + "/" + file)) c.tensors[name] = t;
  return c;
}

inline bool tensor_bytes_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// A fixture batch's input_ids and labels (I64 [B, S]) as the pre-tokenized JSONL `mixtune score` reads, a row a line.
inline void write_batch_jsonl(const std::map<std::string, Tensor>& batch, const std::string& path) {
  const Tensor& ids = batch.at("input_ids");
  const Tensor& labels = batch.at("labels");
  std::ofstream data(path);
  for (int64_t row = 0; row < ids.dim(0); ++row) {
    nlohmann::json rec;
    for (int64_t s = 0; s < ids.dim(1); ++s) {
      rec["input_ids"].push_back(ids.data_as<int64_t>()[row * ids.dim(1) + s]);
      rec["labels"].push_back(labels.data_as<int64_t>()[row * ids.dim(1) + s]);
    }
    data << rec.dump() << "\n";
  }
  if (!data) throw std::runtime_error("write_batch_jsonl: cannot write " + path);
}

// The largest |got - ref| over every F32 tensor of two checkpoints with the same names, shapes and dtypes; throws
// naming the first tensor where they differ otherwise.
inline double max_abs_checkpoint_diff(const FixtureCheckpoint& got, const FixtureCheckpoint& ref) {
  if (got.tensors.size() != ref.tensors.size())
    throw std::runtime_error("checkpoints hold " + std::to_string(got.tensors.size()) + " and " +
                             std::to_string(ref.tensors.size()) + " tensors");
  double worst = 0;
  for (const auto& [name, t] : ref.tensors) {
    const auto it = got.tensors.find(name);
    if (it == got.tensors.end()) throw std::runtime_error(name + " missing");
    const Tensor& g = it->second;
    if (g.shape() != t.shape() || g.dtype() != t.dtype() || t.dtype() != DType::F32)
      throw std::runtime_error(name + ": shape or dtype differs (or is not F32)");
    for (int64_t i = 0; i < t.numel(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(g.data_as<float>()[i] - t.data_as<float>()[i])));
  }
  return worst;
}

}  // namespace mt::test
