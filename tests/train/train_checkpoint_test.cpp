// optimizer_state_read with an expert range (an expert-parallel rank's resume): the non-expert tensors are read
// whole, the stacked expert tensors only in this rank's rows; a share that does not fit the file is an error
// naming the file and the tensor.
#include "train/train_checkpoint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../io/io_test_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mt {
namespace {

TEST(TrainCheckpoint, OptimizerStateReadsOneRanksExperts) {
  io_test::ScratchDir dir;
  std::vector<float> expert(4 * 3 * 2), norm(5);
  for (size_t i = 0; i < expert.size(); ++i) expert[i] = static_cast<float>(i);
  for (size_t i = 0; i < norm.size(); ++i) norm[i] = 100.0f + static_cast<float>(i);
  const std::string ex = "model.layers.0.mlp.experts.down_proj.exp_avg", nm = "model.norm.weight.exp_avg";
  safetensors_write(dir.file("optimizer.safetensors"),
                    {{ex, Tensor::from_floats({4, 3, 2}, expert)}, {nm, Tensor::from_floats({5}, norm)}});
  Tensor e = Tensor::empty({2, 3, 2}, DType::F32), n = Tensor::empty({5}, DType::F32);
  // The table of a model holding that expert stack says which state tensors are stacks.
  const ParamTable table =
      param_table_of(DecoderSpec::from_json(preset_config_json("qwen3-moe-test"), "qwen3-moe-test"));
  optimizer_state_read(dir.path.string(), {{ex, &e}, {nm, &n}}, &table, /*expert_first=*/1, /*expert_count=*/2);
  EXPECT_EQ(e.to_floats(), std::vector<float>(expert.begin() + 6, expert.begin() + 18));  // experts 1 and 2
  EXPECT_EQ(n.to_floats(), norm);
  // Experts 3..4 of 4: past the file's rows.
  try {
    optimizer_state_read(dir.path.string(), {{ex, &e}, {nm, &n}}, &table, 3, 2);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("optimizer.safetensors: tensor '" + ex + "' is F32 [4, 3, 2]"), std::string::npos) << msg;
  }
  // Without a range every tensor must match whole.
  EXPECT_THROW(optimizer_state_read(dir.path.string(), {{ex, &e}, {nm, &n}}), Error);
  Tensor all = Tensor::empty({4, 3, 2}, DType::F32);
  optimizer_state_read(dir.path.string(), {{ex, &all}, {nm, &n}});
  EXPECT_EQ(all.to_floats(), expert);
}

}  // namespace
}  // namespace mt
