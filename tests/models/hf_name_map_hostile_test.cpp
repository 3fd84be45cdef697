// Hostile checkpoints and bad rule lists: each is refused with one line naming the file and the tensor (or the
// parameter and rule), before any parameter is allocated, and never crashes.
#include <gtest/gtest.h>

#include "../io/io_test_util.h"
#include "hf_rules_test_util.h"
#include "io/dequant.h"

namespace mt {
namespace {

using hf_test::FakeCheckpoint;
using hf_test::pattern_tensor;
using io_test::expect_error;

const std::string kFile1 = "ckpt/model-00001-of-00002.safetensors";  // FakeCheckpoint::file_for, odd-length names
const std::string kFile2 = "ckpt/model-00002-of-00002.safetensors";

std::string file_of(const std::string& name) { return FakeCheckpoint::file_for(name); }

struct Qwen {
  // 2 layers of 3 experts, I = 2, H = 4; dense layers have no MLP here (not needed by the map).
  std::vector<HfParam> params = {{"model.embed_tokens.weight", {5, 4}, DType::F32},
                                 {"model.layers.0.mlp.gate.weight", {3, 4}, DType::F32},
                                 {"model.layers.0.mlp.experts.gate_up_proj", {3, 4, 4}, DType::F32, true},
                                 {"model.layers.0.mlp.experts.down_proj", {3, 4, 2}, DType::F32, true},
                                 {"model.norm.weight", {4}, DType::F32}};
  HfNameMap map{hf_test::qwen3_layout(true, false), params};
  FakeCheckpoint ckpt = hf_test::saved_checkpoint(map, hf_test::pattern_params(params));
};

TEST(HfNameMapHostile, MissingUnexpectedWrongShapeWrongDtype) {
  const std::string up1 = "model.layers.0.mlp.experts.1.up_proj.weight";
  {
    Qwen q;
    q.ckpt.erase(up1);
    expect_error([&] { q.map.load(q.ckpt.view()); }, {"ckpt: tensor '" + up1 + "' is missing", "expected shape [2, 4]"});
  }
  {
    Qwen q;
    q.ckpt.add("model.layers.0.mlp.experts.3.up_proj.weight", pattern_tensor({2, 4}, DType::F32, 1));  // E = 3
    q.ckpt.add("model.layers.0.extra", pattern_tensor({1}, DType::F32, 1));
    expect_error([&] { q.map.load(q.ckpt.view()); },
                 {file_of("model.layers.0.mlp.experts.3.up_proj.weight"),
                  "unexpected tensor 'model.layers.0.mlp.experts.3.up_proj.weight'", "1 more: model.layers.0.extra"});
  }
  {
    Qwen q;
    q.ckpt.at(up1) = pattern_tensor({4, 2}, DType::F32, 1);  // transposed
    expect_error([&] { q.map.load(q.ckpt.view()); },
                 {file_of(up1) + ": tensor '" + up1 + "': wrong shape (expected [2, 4], found [4, 2])"});
    q.ckpt.at(up1) = pattern_tensor({2}, DType::F32, 1);  // truncated
    expect_error([&] { q.map.load(q.ckpt.view()); }, {up1, "wrong shape (expected [2, 4], found [2])"});
    q.ckpt.at(up1) = Tensor::empty({0, 4}, DType::F32);  // empty
    expect_error([&] { q.map.load(q.ckpt.view()); }, {up1, "found [0, 4]"});
    // A huge claimed shape is compared, never allocated or read.
    q.ckpt.at(up1) = Tensor::absent({int64_t{1} << 40, int64_t{1} << 20}, DType::BF16);
    expect_error([&] { q.map.load(q.ckpt.view()); }, {up1, "found [1099511627776, 1048576]"});
  }
  {
    Qwen q;
    q.ckpt.at(up1) = Tensor::zeros({2, 4}, DType::I32);
    expect_error([&] { q.map.load(q.ckpt.view()); },
                 {file_of(up1), up1, "wrong dtype (expected F32, BF16 or F16", "found I32)"});
    q.ckpt.at(up1) = Tensor::zeros({2, 4}, DType::F8_E4M3);  // FP8 without its _scale_inv
    expect_error([&] { q.map.load(q.ckpt.view()); }, {up1, "F8_E4M3"});
  }
}

TEST(HfNameMapHostile, DuplicateTensorsAndExpertIndices) {
  const std::string up1 = "model.layers.0.mlp.experts.1.up_proj.weight";
  {
    Qwen q;  // the same name in two files
    q.ckpt.add(up1, pattern_tensor({2, 4}, DType::F32, 2));
    expect_error([&] { q.map.load(q.ckpt.view()); }, {"tensor '" + up1 + "' is stored twice"});
  }
  {
    Qwen q;  // expert 1 spelled twice
    q.ckpt.add("model.layers.0.mlp.experts.01.up_proj.weight", pattern_tensor({2, 4}, DType::F32, 2));
    expect_error([&] { q.map.load(q.ckpt.view()); },
                 {"tensor 'model.layers.0.mlp.experts.01.up_proj.weight': duplicate expert index", up1});
  }
  {
    Qwen q;  // a leading zero alone is not an index of ours
    q.ckpt.erase(up1);
    q.ckpt.add("model.layers.0.mlp.experts.01.up_proj.weight", pattern_tensor({2, 4}, DType::F32, 2));
    expect_error([&] { q.map.load(q.ckpt.view()); }, {"unexpected tensor 'model.layers.0.mlp.experts.01.up_proj.weight'"});
  }
}

// DeepSeek-V3-style FP8: scales missing, mis-shaped, of the wrong dtype, or without an FP8 weight.
TEST(HfNameMapHostile, Fp8Scales) {
  const std::vector<HfParam> params = {{"w.weight", {6, 5}, DType::BF16}};
  HfLayout l;
  l.rules = {hf_quantised("w.weight", hf_fp8_block)};
  const HfNameMap map(l, params);
  HfLoadOptions o;
  o.fp8_block_rows = o.fp8_block_cols = 4;
  auto ckpt = [&](Tensor w, Tensor s) {
    FakeCheckpoint c;
    c.add("w.weight", std::move(w));
    if (s.defined()) c.add("w.weight_scale_inv", std::move(s));
    return c;
  };
  const Tensor q = Tensor::zeros({6, 5}, DType::F8_E4M3);
  const Tensor good = Tensor::from_floats({2, 2}, {1, 2, 3, 4});
  EXPECT_NO_THROW(map.load(ckpt(q, good).view(), o));
  expect_error([&] { map.load(ckpt(q, Tensor()).view(), o); },
               {file_of("w.weight"), "'w.weight_scale_inv' is missing", "F8_E4M3"});
  expect_error([&] { map.load(ckpt(q, Tensor::from_floats({1, 2}, {1, 2})).view(), o); },
               {file_of("w.weight_scale_inv"), "'w.weight_scale_inv': wrong shape (expected [2, 2]", "found [1, 2]"});
  expect_error([&] { map.load(ckpt(q, good).view()); },  // 128x128 blocks expect one scale
               {"'w.weight_scale_inv': wrong shape (expected [1, 1] for 128x128 blocks"});
  expect_error([&] { map.load(ckpt(q, Tensor::from_floats({2, 2}, {1, 2, 3, 4}, DType::BF16)).view(), o); },
               {"'w.weight_scale_inv': wrong dtype (expected F32, found BF16)"});
  expect_error([&] { map.load(ckpt(pattern_tensor({6, 5}, DType::BF16, 1), good).view(), o); },
               {"'w.weight_scale_inv' is stored but 'w.weight' is BF16 (not F8_E4M3)"});
  expect_error([&] { map.load(ckpt(Tensor::zeros({6, 4}, DType::F8_E4M3), good).view(), o); },
               {"'w.weight': wrong shape (expected [6, 5], found [6, 4])"});
  FakeCheckpoint scale_only;
  scale_only.add("w.weight_scale_inv", good);
  expect_error([&] { map.load(scale_only.view(), o); },
               {file_of("w.weight_scale_inv"), "'w.weight_scale_inv' has no weight 'w.weight'"});
  HfLoadOptions undeclared = o;  // config.json without quantization_config
  undeclared.fp8_declared = false;
  expect_error([&] { map.load(ckpt(q, good).view(), undeclared); },
               {file_of("w.weight"), "'w.weight' is F8_E4M3 but config.json has no quantization_config"});
}

// A layout with fp8_any_matrix reads any 2+-dim tensor in FP8 form; 1-dim tensors have no scale slot.
TEST(HfNameMapHostile, Fp8AnyMatrix) {
  const std::vector<HfParam> params = {{"w.weight", {6, 5}, DType::F32}, {"n.weight", {5}, DType::F32}};
  HfLayout l;
  l.fp8_any_matrix = true;
  const HfNameMap map(l, params);
  HfLoadOptions o;
  o.fp8_block_rows = o.fp8_block_cols = 4;
  FakeCheckpoint c;
  c.add("w.weight", Tensor::zeros({6, 5}, DType::F8_E4M3));
  c.add("w.weight_scale_inv", Tensor::from_floats({2, 2}, {1, 2, 3, 4}));
  c.add("n.weight", Tensor::from_floats({5}, {1, 1, 1, 1, 1}));
  EXPECT_NO_THROW(map.load(c.view(), o));
  c.add("n.weight_scale_inv", Tensor::from_floats({1}, {1}));
  expect_error([&] { map.load(c.view(), o); },
               {file_of("n.weight_scale_inv"), "unexpected tensor 'n.weight_scale_inv'"});
}

// GPT-OSS-style MXFP4: half a pair, both forms, wrong shapes or dtypes.
TEST(HfNameMapHostile, Mxfp4BlocksAndScales) {
  const std::vector<HfParam> params = {{"x.down_proj", {2, 4, 32}, DType::BF16, true}};  // [E, H, I]
  HfLayout l;
  l.rules = {hf_param("x.down_proj", hf_transpose(hf_tensor("x.down_proj", hf_mxfp4)))};
  const HfNameMap map(l, params);
  const Tensor blocks = Tensor::zeros({2, 4, 1, 16}, DType::U8), scales = Tensor::zeros({2, 4, 1}, DType::U8);
  auto ckpt = [](std::vector<std::pair<std::string, Tensor>> t) {
    FakeCheckpoint c;
    c.tensors = std::move(t);
    return c;
  };
  EXPECT_NO_THROW(map.load(ckpt({{"x.down_proj_blocks", blocks}, {"x.down_proj_scales", scales}}).view()));
  expect_error([&] { map.load(ckpt({{"x.down_proj_blocks", blocks}}).view()); },
               {"'x.down_proj_scales' is missing (its blocks are stored)"});
  expect_error([&] { map.load(ckpt({{"x.down_proj_scales", scales}}).view()); }, {"'x.down_proj_blocks' is missing"});
  expect_error([&] {
    map.load(ckpt({{"x.down_proj_blocks", blocks}, {"x.down_proj_scales", scales},
                   {"x.down_proj", Tensor::zeros({2, 32, 4}, DType::BF16)}}).view());
  }, {"'x.down_proj' is stored both plain and as MXFP4 blocks"});
  expect_error([&] {
    map.load(ckpt({{"x.down_proj_blocks", Tensor::zeros({2, 4, 2, 16}, DType::U8)}, {"x.down_proj_scales", scales}})
                 .view());
  }, {file_of("x.down_proj_blocks"), "'x.down_proj_blocks': wrong shape (expected [2, 4, 1, 16]", "found [2, 4, 2, 16]"});
  expect_error([&] {
    map.load(ckpt({{"x.down_proj_blocks", blocks}, {"x.down_proj_scales", Tensor::zeros({2, 4}, DType::U8)}}).view());
  }, {"'x.down_proj_scales': wrong shape (expected [2, 4, 1]"});
  expect_error([&] {
    map.load(ckpt({{"x.down_proj_blocks", blocks}, {"x.down_proj_scales", Tensor::zeros({2, 4, 1}, DType::F32)}}).view());
  }, {"'x.down_proj_scales': wrong dtype (expected U8, found F32)"});
  // Expert range beyond the stack.
  HfLoadOptions o;
  o.expert_first = 1;
  o.expert_count = 2;
  expect_error([&] { map.load(ckpt({{"x.down_proj_blocks", blocks}, {"x.down_proj_scales", scales}}).view(), o); },
               {"experts [1, 3) of parameter 'x.down_proj' with 2"});
}

TEST(HfNameMapHostile, BadRulesAreRefusedWhenTheMapIsBuilt) {
  auto build = [](std::vector<HfRule> rules, std::vector<HfParam> params) {
    HfLayout l;
    l.rules = std::move(rules);
    HfNameMap m(l, std::move(params));
  };
  expect_error([&] { build({hf_param("a", hf_concat(0, {hf_tensor("b"), hf_tensor("c")}))}, {{"a", {3}, DType::F32}}); },
               {"parameter 'a' [3]", "cannot split dim 0 into 2 equal parts"});
  expect_error([&] { build({hf_param("a", hf_transpose(hf_tensor("b")))}, {{"a", {3}, DType::F32}}); },
               {"parameter 'a'", "transpose needs one operand of 2+ dims"});
  expect_error([&] { build({hf_param("a", hf_deinterleave(1, hf_tensor("b")))}, {{"a", {2, 3}, DType::F32}}); },
               {"cannot deinterleave dim 1"});
  expect_error([&] { build({hf_param("a", hf_tensor("b"))}, {{"a", {2}, DType::F32}, {"b", {2}, DType::F32}}); },
               {"checkpoint tensor 'b' is claimed by parameters 'a' and 'b'"});
  expect_error([&] { build({hf_param("a", hf_stack_experts(hf_tensor("a.w")))}, {{"a", {2, 3}, DType::F32}}); },
               {"'a.w' is claimed by parameters 'a' and 'a'"});
  expect_error([&] { build({hf_param("a", hf_tensor("a.{E}"))}, {{"a", {2}, DType::F32}}); },
               {"placeholder {E} is not bound here"});
  expect_error([&] { build({hf_drop("a.{*}")}, {{"a.w", {2}, DType::F32}}); },
               {"checkpoint tensor 'a.w' of parameter 'a.w' matches a drop rule"});
  expect_error([&] { build({hf_rename("x.", "model."), hf_rename("y.", "model.")}, {{"y.w", {2}, DType::F32}}); },
               {"renames are not invertible for 'y.w'"});
  expect_error([&] { build({hf_param("a.{*}", hf_tensor("b"))}, {{"a.w", {2}, DType::F32}}); },
               {"'{*}' is allowed only at the end of a rename or drop pattern"});
  expect_error([&] { build({hf_param("a", hf_tensor("a", hf_mxfp4))}, {{"a", {6}, DType::F32}}); },
               {"'a' [6] cannot be MXFP4"});
  expect_error([&] { build({hf_param("a", hf_concat(0, {hf_tensor("b"), hf_tensor("c")}))}, {{"a", {2, 3}, DType::F32, true}}); },
               {"an expert stack's rule must keep experts on dim 0"});
  expect_error([&] { build({}, {{"a", {int64_t{1} << 40, int64_t{1} << 40}, DType::F32}}); },
               {"parameter 'a'", "too large"});
  expect_error([&] { build({}, {{"a", {2}, DType::I32}}); }, {"parameter 'a' [2]", "dtype I32"});
  expect_error([&] { build({hf_param("a", hf_stack_experts(hf_tensor("a.{E}")))}, {{"a", {int64_t{1} << 30, 1}, DType::F32}}); },
               {"1073741824 experts is more than a stack supports"});
}

}  // namespace
}  // namespace mt
