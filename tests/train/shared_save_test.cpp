// Saving from every rank of a job (train/shared_save.h) with each rank a thread of this process over the TCP
// communicator: the files two ranks write together (each holding only its experts' rows, the rest of its
// tensors garbage) are byte for byte those one writer makes from the complete tensors, sharded model files
// and a stacked optimizer-state file alike; a rank that fails makes every rank fail and nothing is
// committed; which rows each rank of a layout writes.
#include "train/shared_save.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../distributed/thread_ranks.h"
#include "../io/io_test_util.h"
#include "../models/hf_rules_test_util.h"
#include "core/error.h"
#include "distributed/tcp_socket.h"
#include "io/checkpoint_files.h"
#include "io/safetensors.h"
#include "io/safetensors_shared.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint_map.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;

// body(rank, comm) on `world` threads joined by TCP communicators; each rank's error ("" = none).
std::vector<std::string> run_ranks(int world, const std::function<void(int, Communicator&)>& body) {
  const int port = test::free_port();
  std::vector<std::string> err(world);
  std::vector<std::thread> t;
  for (int r = 0; r < world; ++r)
    t.emplace_back([&, r] {
      try {
        ProcessGroupEnv e;
        e.rank = r, e.world = world, e.master_addr = "127.0.0.1", e.master_port = port;
        auto comm = tcp_communicator_create(e, std::chrono::milliseconds(20000));
        body(r, *comm);
      } catch (const std::exception& ex) {
        err[r] = ex.what();
      }
    });
  for (auto& x : t) x.join();
  return err;
}

// A Qwen3-MoE of 4 layers and `experts` experts: the parameters and checkpoint tensors the names below refer to.
DecoderSpec moe_spec(int64_t experts) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["num_hidden_layers"] = 4;
  j["num_experts"] = experts;
  return DecoderSpec::from_json(j, "qwen3-moe-test");
}
std::shared_ptr<const ParamTable> moe_table(int64_t experts) {
  return std::make_shared<const ParamTable>(param_table_of(moe_spec(experts)));
}
// Its save share: the rows of its tensors rank `rank` writes.
SaveShare moe_share(Communicator* comm, int rank, int world, int64_t ep, int64_t experts,
                    const OptimizerShards& shards = {}) {
  const auto table = moe_table(experts);
  return save_share_for(comm, rank, world, ep, table, hf_name_map_of(moe_spec(experts), *table, DType::BF16), shards);
}

Tensor ramp(const Shape& shape, DType dt, float start) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return Tensor::from_floats(shape, v, dt);
}

// A model-like set (non-expert tensors, per-expert HF names for 4 experts) and a state-like set (stacked
// [4, ...] expert tensors named like optimizer state, plus a non-expert one).
Named model_tensors() {
  Named t = {{"model.embed_tokens.weight", ramp({6, 4}, DType::BF16, 1)},
             {"model.layers.0.self_attn.q_proj.weight", ramp({4, 4}, DType::BF16, 100)}};
  for (int e = 0; e < 4; ++e)
    t.emplace_back("model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj.weight",
                   ramp({4, 3}, DType::BF16, 200.0f + 20 * e));
  t.emplace_back("model.norm.weight", ramp({4}, DType::F32, 7));
  return t;
}
Named state_tensors() {
  return {{"model.layers.0.mlp.experts.down_proj.exp_avg", ramp({4, 4, 3}, DType::F32, 3)},
          {"model.layers.0.self_attn.q_proj.weight.exp_avg", ramp({4, 4}, DType::F32, 9)}};
}

// A rank's copy: every row it does not write overwritten with garbage (0xFF bytes: NaN in bf16 and f32).
Named as_held_by(const Named& full, const std::function<std::pair<int64_t, int64_t>(const std::string&, const Tensor&)>& rows) {
  Named r;
  for (const auto& [name, t] : full) {
    Tensor c = t.clone();
    const auto [r0, r1] = rows(name, c);
    const int64_t n = c.dim(0);
    const size_t row_bytes = c.nbytes() / static_cast<size_t>(n);
    for (int64_t i = 0; i < n; ++i)
      if (i < r0 || i >= r1) std::memset(static_cast<char*>(c.data()) + i * row_bytes, 0xFF, row_bytes);
    r.emplace_back(name, c);
  }
  return r;
}

CheckpointWriteOptions sharded() {
  CheckpointWriteOptions o;
  o.max_shard_bytes = 80;  // several shards, experts of one rank in different files
  return o;
}

const std::map<std::string, std::string> kStateMeta = {{"format", "mixtune-adamw"}};

TEST(SharedSave, TwoRanksWriteTheBytesOfOneWriter) {
  io_test::ScratchDir dir;
  const Named model = model_tensors(), state = state_tensors();
  const fs::path want = dir.path / "one", got = dir.path / "two";
  fs::create_directories(want);
  const std::vector<std::string> files = checkpoint_write_tensors(want.string(), model, sharded());
  safetensors_write((want / "optimizer.safetensors").string(), state, kStateMeta);
  ASSERT_GT(files.size(), 2u) << "the test wants several shards";

  const std::vector<std::string> err = run_ranks(2, [&](int rank, Communicator& comm) {
    const SaveShare share = moe_share(&comm, rank, 2, /*ep=*/2, 4);
    const Named my_model = as_held_by(model, [&](auto& n, auto& t) { return share.model_rows(n, t); });
    const Named my_state = as_held_by(state, [&](auto& n, auto& t) { return share.state_rows(n, t); });
    shared_dir_save(
        share, got.string(),
        [&](const std::string& tmp) {
          checkpoint_shared_create(tmp, my_model, sharded());
          safetensors_shared_create(tmp + "/optimizer.safetensors", my_state, kStateMeta);
        },
        [&](const std::string& tmp) {
          checkpoint_shared_write(tmp, my_model, sharded(), [&](auto& n, auto& t) { return share.model_rows(n, t); });
          safetensors_shared_write(tmp + "/optimizer.safetensors", my_state, kStateMeta,
                                   [&](auto& n, auto& t) { return share.state_rows(n, t); });
        });
  });
  ASSERT_EQ(err, std::vector<std::string>(2)) << err[0] << " | " << err[1];
  std::vector<std::string> all = files;
  all.push_back("optimizer.safetensors");
  for (const std::string& f : all) {
    SCOPED_TRACE(f);
    EXPECT_EQ(io_test::read_bytes((got / f).string()), io_test::read_bytes((want / f).string()));
  }
  for (const auto& e : fs::directory_iterator(dir.path))  // no temp directory left behind
    EXPECT_TRUE(e.path() == want || e.path() == got) << e.path();
}

TEST(SharedSave, AFailingRankCommitsNothingAnywhere) {
  io_test::ScratchDir dir;
  const Named model = model_tensors();
  const fs::path out = dir.path / "final";
  const std::vector<std::string> err = run_ranks(2, [&](int rank, Communicator& comm) {
    const SaveShare share = moe_share(&comm, rank, 2, 2, 4);
    shared_dir_save(
        share, out.string(), [&](const std::string& tmp) { checkpoint_shared_create(tmp, model, sharded()); },
        [&](const std::string& tmp) {
          if (rank == 1) fail("rank 1: no space left on device (simulated)");
          checkpoint_shared_write(tmp, model, sharded(), [&](auto& n, auto& t) { return share.model_rows(n, t); });
        });
  });
  EXPECT_NE(err[1].find("no space left on device (simulated)"), std::string::npos) << err[1];
  EXPECT_NE(err[0].find("failed on 1 other rank"), std::string::npos) << err[0];
  EXPECT_NE(err[0].find("nothing was committed"), std::string::npos) << err[0];
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the lead's temp directory was not removed";

  // The lead failing to lay the directory out reaches the other rank before it writes anything.
  const std::vector<std::string> err2 = run_ranks(2, [&](int rank, Communicator& comm) {
    const SaveShare share = moe_share(&comm, rank, 2, 2, 4);
    bool wrote = false;
    shared_dir_save(
        share, out.string(), [&](const std::string&) { fail("config.json: write failed (simulated)"); },
        [&](const std::string&) { wrote = true; });
    EXPECT_FALSE(wrote);
  });
  EXPECT_NE(err2[0].find("write failed (simulated)"), std::string::npos) << err2[0];
  EXPECT_NE(err2[1].find("rank 0 could not lay out the output"), std::string::npos) << err2[1];
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(SharedSave, AFileLaidOutForOtherTensorsIsAnError) {
  io_test::ScratchDir dir;
  const Named model = model_tensors(), state = state_tensors();
  const std::string path = dir.file("optimizer.safetensors");
  safetensors_shared_create(path, state, kStateMeta);
  try {
    safetensors_shared_write(path, model, kStateMeta, [](auto&, const Tensor& t) { return std::pair<int64_t, int64_t>{0, t.dim(0)}; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

TEST(SharedSave, RowsEachRankWrites) {
  const Tensor stacked = Tensor::empty({8, 2}, DType::F32), plain = Tensor::empty({5, 2}, DType::F32);
  const std::string expert5 = "model.layers.3.mlp.experts.5.up_proj.weight", other = "model.norm.weight";
  const std::string state = "model.layers.3.mlp.experts.gate_up_proj.exp_avg_sq";
  using R = std::pair<int64_t, int64_t>;
  const R none{0, 0};
  // EP 2 over 4 ranks: ranks 0 and 1 write experts 0-3 / 4-7; ranks 2 and 3 (replicas) nothing.
  for (int rank = 0; rank < 4; ++rank) {
    const SaveShare s = moe_share(nullptr, rank, 4, 2, 8);
    SCOPED_TRACE(rank);
    const R all_plain{0, 5}, first_half{0, 4}, second_half{4, 8};
    EXPECT_EQ(s.model_rows(other, plain), rank == 0 ? all_plain : none);
    EXPECT_EQ(s.model_rows(expert5, plain), rank == 1 ? all_plain : none);
    EXPECT_EQ(s.state_rows(state, stacked), rank == 0 ? first_half : rank == 1 ? second_half : none);
  }
  // No expert parallelism (or a layout the engines reject): the lead writes everything.
  for (const int64_t ep : {int64_t{1}, int64_t{3}}) {
    const R all_stacked{0, 8};
    EXPECT_EQ(moe_share(nullptr, 0, 2, ep, 8).state_rows(state, stacked), all_stacked);
    EXPECT_EQ(moe_share(nullptr, 1, 2, ep, 8).model_rows(expert5, plain), none);
    EXPECT_EQ(moe_share(nullptr, 1, 2, ep, 8).state_rows(state, stacked), none);
  }
}

// A sharded optimizer (train/optimizer_shards.h): each sharded parameter's state and HF tensors (a stacked
// expert's per-expert tensors included) are written by its owner; unsharded ones keep the rules above.
TEST(SharedSave, ShardedParametersAreWrittenByTheirOwners) {
  const Tensor stacked = Tensor::empty({8, 2}, DType::F32), plain = Tensor::empty({5, 2}, DType::F32);
  const std::vector<std::pair<std::string, int64_t>> params = {
      {"model.embed_tokens.weight", 100}, {"model.norm.weight", 2}, {"model.layers.3.mlp.experts.gate_up_proj", 16}};
  const auto table = moe_table(8);
  using R = std::pair<int64_t, int64_t>;
  const R none{0, 0}, all_plain{0, 5}, all_stacked{0, 8};
  // Two ranks, no expert parallelism: embed -> rank 0, the experts (16) -> rank 1, the norm (2) -> rank 1.
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const OptimizerShards shards(params, 2, rank, [](const std::string&) { return true; });
    const SaveShare s = moe_share(nullptr, rank, 2, 1, 8, shards);
    EXPECT_EQ(s.model_rows("model.embed_tokens.weight", plain), rank == 0 ? all_plain : none);
    EXPECT_EQ(s.model_rows("model.norm.weight", plain), rank == 1 ? all_plain : none);
    EXPECT_EQ(s.state_rows("model.norm.weight.exp_avg", plain), rank == 1 ? all_plain : none);
    EXPECT_EQ(s.state_rows("model.embed_tokens.weight.master", plain), rank == 0 ? all_plain : none);
    EXPECT_EQ(s.model_rows("model.layers.3.mlp.experts.5.up_proj.weight", plain), rank == 1 ? all_plain : none);
    EXPECT_EQ(s.state_rows("model.layers.3.mlp.experts.gate_up_proj.exp_avg_sq", stacked), rank == 1 ? all_stacked : none);
    EXPECT_EQ(s.model_rows("model.layers.3.self_attn.q_proj.weight", plain), rank == 0 ? all_plain : none);  // not listed
  }
  // EP 2: the experts stay with expert parallelism (owner -1), the rest with their owners.
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const OptimizerShards shards(params, 2, rank, [&](const std::string& n) { return !table->is_expert_stack(n); });
    const SaveShare s = moe_share(nullptr, rank, 2, 2, 8, shards);
    const R half = rank == 0 ? R{0, 4} : R{4, 8};
    EXPECT_EQ(s.state_rows("model.layers.3.mlp.experts.gate_up_proj.exp_avg", stacked), half);
    EXPECT_EQ(s.model_rows("model.layers.3.mlp.experts.5.up_proj.weight", plain), rank == 1 ? all_plain : none);
    EXPECT_EQ(s.model_rows("model.norm.weight", plain), rank == 1 ? all_plain : none);
  }
}

// Four ranks, EP 2, the expert stacks' state sharded over their two replicas ({0, 2} hold experts 0-3, {1, 3}
// experts 4-7): gate_up (the larger) goes to replica position 0, down to position 1, in both replica groups.
// Each owner writes its experts' rows of the stack's state and its experts' per-expert HF tensors; every row and
// every per-expert tensor is written by exactly one rank, never by a rank that does not hold that expert.
TEST(SharedSave, ExpertStacksShardedOverReplicasAreWrittenByTheirOwners) {
  const Tensor stacked = Tensor::empty({8, 2}, DType::F32), plain = Tensor::empty({5, 2}, DType::F32);
  const std::vector<std::pair<std::string, int64_t>> params = {{"model.embed_tokens.weight", 100},
                                                               {"model.layers.3.mlp.experts.gate_up_proj", 16},
                                                               {"model.layers.3.mlp.experts.down_proj", 8}};
  const auto table = moe_table(8);
  using R = std::pair<int64_t, int64_t>;
  const R none{0, 0}, all_plain{0, 5};
  std::vector<std::vector<int>> state_writers(2, std::vector<int>(8, 0)), model_writers(2, std::vector<int>(8, 0));
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    const OptimizerShards shards(
        params, 4, rank, [&](const std::string& n) { return !table->is_expert_stack(n); },
        expert_replica_ranks(4, rank, 2), [&](const std::string& n) { return table->is_expert_stack(n); });
    ASSERT_TRUE(shards.experts_sharded());
    const SaveShare s = moe_share(nullptr, rank, 4, 2, 8, shards);
    const int64_t first = rank % 2 * 4;
    const R mine{first, first + 4};
    const bool owns_gate_up = rank < 2, owns_down = rank >= 2;
    EXPECT_EQ(s.state_rows("model.layers.3.mlp.experts.gate_up_proj.exp_avg", stacked), owns_gate_up ? mine : none);
    EXPECT_EQ(s.state_rows("model.layers.3.mlp.experts.down_proj.exp_avg_sq", stacked), owns_down ? mine : none);
    EXPECT_EQ(s.model_rows("model.embed_tokens.weight", plain), shards.owner(size_t{0}) == rank ? all_plain : none);
    int k = 0;
    for (const char* stack : {"gate_up_proj", "down_proj"}) {
      const R rows = s.state_rows(std::string("model.layers.3.mlp.experts.") + stack + ".master", stacked);
      for (int64_t e = rows.first; e < rows.second; ++e) ++state_writers[k][static_cast<size_t>(e)];
      for (int64_t e = 0; e < 8; ++e) {
        const std::string name = "model.layers.3.mlp.experts." + std::to_string(e) +
                                 (k == 0 ? ".gate_proj.weight" : ".down_proj.weight");
        if (s.model_rows(name, plain) == all_plain) {
          ++model_writers[k][static_cast<size_t>(e)];
          EXPECT_TRUE(e >= first && e < first + 4) << name << ": written by a rank that does not hold it";
        }
      }
      ++k;
    }
  }
  for (int k = 0; k < 2; ++k)
    for (int e = 0; e < 8; ++e) {
      EXPECT_EQ(state_writers[k][e], 1) << "stack " << k << " expert " << e;
      EXPECT_EQ(model_writers[k][e], 1) << "stack " << k << " expert " << e;
    }
}

// Layouts where the tensor names do not say which expert a tensor holds the Qwen way (".mlp.experts.<e>."): the
// checkpoint map does. GPT-OSS stores each expert stack fused and transposed ([E, H, 2I], gate/up interleaved): a
// rank writes its experts' rows of it. Nemotron-H stores per-expert tensors under "backbone.layers.L.mixer.experts.
// <e>.": a rank writes its experts' tensors. Two ranks, EP 2, each holding all E rows of every stack with the other
// rank's experts (and, on rank 1, every replicated tensor) garbage (the GPU engine's host copy), or holding only its
// experts' rows (the CPU engine's compact stacks, HfNameMap::save(values, expert_first)): the shared files are byte
// for byte what one writer makes from the whole model.
TEST(SharedSave, FusedAndRenamedExpertLayoutsWriteTheRightRows) {
  struct Layout {
    const char* what;
    HfLayout layout;
    std::vector<HfParam> params;
    int64_t experts;
  };
  hf_test::GptOssDims g;
  g.E = 4;
  hf_test::NemhDims n;
  n.E = 4;
  const Layout layouts[] = {{"gpt-oss", hf_test::gpt_oss_layout(), hf_test::gpt_oss_params(g), g.E},
                            {"nemotron-h", hf_test::nemotron_h_layout(), hf_test::nemotron_h_params(n), n.E}};
  using R = std::pair<int64_t, int64_t>;
  for (const Layout& l : layouts) {
    for (const bool compact : {false, true}) {
      SCOPED_TRACE(std::string(l.what) + (compact ? ", compact stacks" : ", all E rows held"));
      const HfNameMap map(l.layout, l.params);
      auto table = std::make_shared<ParamTable>();
      table->num_experts = l.experts;
      for (const HfParam& p : l.params)
        table->add(param_entry(p.name, p.shape, ParamUse::linear,
                               p.expert_stack ? ParamRole::expert_stack : ParamRole::replicated));
      const std::vector<Tensor> values = hf_test::pattern_params(l.params);
      io_test::ScratchDir dir;
      CheckpointWriteOptions o;
      o.max_shard_bytes = 256;  // several files
      const Named whole = map.save(values);
      const std::vector<std::string> files = checkpoint_write_tensors(dir.file("one"), whole, o);
      ASSERT_GT(files.size(), 1u);
      checkpoint_shared_create(dir.file("two"), whole, o);
      for (int rank = 0; rank < 2; ++rank) {
        SCOPED_TRACE(rank);
        const SaveShare share = save_share_for(nullptr, rank, 2, 2, table, map);
        const int64_t first = rank * l.experts / 2, count = l.experts / 2;
        std::vector<Tensor> held;
        for (size_t i = 0; i < values.size(); ++i) {
          if (compact && l.params[i].expert_stack) {
            held.push_back(values[i].rows(first, first + count).clone());
            continue;
          }
          Tensor t = values[i].clone();
          const int64_t rows = t.dim(0);
          const size_t row_bytes = t.nbytes() / static_cast<size_t>(rows);
          for (int64_t r = 0; r < rows; ++r) {
            const bool mine = l.params[i].expert_stack ? r >= first && r < first + count : rank == 0;
            if (!mine) std::memset(static_cast<char*>(t.data()) + r * row_bytes, 0xFF, row_bytes);
          }
          held.push_back(t);
        }
        const Named mine = map.save(held, compact ? first : 0);
        for (const auto& [name, t] : mine) {
          const R rows = share.model_rows(name, t);
          if (name == "model.layers.0.mlp.experts.gate_up_proj") {
            EXPECT_EQ(rows, (R{first, first + count}));
          }
          if (name == "backbone.layers.1.mixer.experts.3.up_proj.weight") {
            EXPECT_EQ(rows, (rank == 1 ? R{0, 4} : R{0, 0}));
          }
          if (name == "backbone.embeddings.weight") {
            EXPECT_EQ(rows, (rank == 0 ? R{0, 16} : R{0, 0}));
          }
        }
        checkpoint_shared_write(dir.file("two"), mine, o,
                                [&](auto& name, auto& t) { return share.model_rows(name, t); });
      }
      for (const std::string& f : files)
        EXPECT_EQ(io_test::read_bytes(dir.file("two") + "/" + f), io_test::read_bytes(dir.file("one") + "/" + f)) << f;
    }
  }
}

// A tensor the model's checkpoint does not have is an error, not silently left to the lead.
TEST(SharedSave, ANameOutsideTheCheckpointIsAnError) {
  const Tensor plain = Tensor::empty({5, 2}, DType::F32);
  try {
    moe_share(nullptr, 0, 2, 2, 8).model_rows("model.layers.9.mlp.experts.1.up_proj.weight", plain);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("'model.layers.9.mlp.experts.1.up_proj.weight' is not a tensor of this model's checkpoint"),
              std::string::npos)
        << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace mt
