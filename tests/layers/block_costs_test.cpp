// The blocks' cost models (layers/costs/) against byte and FLOP counts worked out by hand, and their sums
// (models/decoder_costs.h, train/memory_plan.h) over a spec whose layers mix sublayers of different sizes:
//   layer 0 [attention, MoE 0 (I 32)]   layer 1 [attention, MLP 0 (F 128)]
//   layer 2 [attention, MoE 1 (I 48)]   layer 3 [attention, MLP 1 (F 96)]
// on the qwen3-moe-test shapes (hidden 64, 4 / 2 heads of 16, 8 experts top-2, vocab 512), T = 256 tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "layers/costs/attention_cost.h"
#include "layers/costs/block_cost.h"
#include "layers/costs/mamba2_cost.h"
#include "layers/costs/mlp_cost.h"
#include "layers/costs/moe_cost.h"
#include "models/decoder_costs.h"
#include "models/presets.h"
#include "models/spec/config_writer.h"
#include "train/memory_plan.h"

namespace mt {
namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
int64_t i64(CostBytes b) { return static_cast<int64_t>(b); }

DecoderSpec mixed_spec() {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["num_hidden_layers"] = 4;
  DecoderSpec s = DecoderSpec::from_json(j, "qwen3-moe-test");
  MoeSpec moe1 = s.moe[0];
  moe1.expert.intermediate_size = 48;
  s.moe.push_back(moe1);
  MlpSpec mlp1 = s.mlp[0];
  mlp1.intermediate_size = 96;
  s.mlp.push_back(mlp1);
  using K = SublayerKind;
  s.layers = {{{{K::attention, 0}, {K::moe, 0}}},
              {{{K::attention, 0}, {K::mlp, 0}}},
              {{{K::attention, 0}, {K::moe, 1}}},
              {{{K::attention, 0}, {K::mlp, 1}}}};
  spec_check(s, "mixed");
  return s;
}

BlockBatch batch(Recompute r) {
  BlockBatch b;
  b.tokens = 256;
  b.recompute = r;
  return b;
}


// ---- each block by hand ----

TEST(BlockCosts, AttentionKeepsWhatTheCudaBlockKeeps) {
  const AttentionSpec a = mixed_spec().attention[0];
  const int64_t kept = sum({256 * 64 * 2,   // q
                            256 * 32 * 2,   // k
                            256 * 32 * 2,   // v
                            256 * 64 * 2,   // o
                            4 * 256 * 4});  // lse f32
  const int64_t cheap = sum({256 * 64 * 2, 256 * 64 * 2, 256 * 32 * 2});  // a, qr, kr
  const int64_t backward = sum({256 * 64 * 2,                    // d(o)
                                (4 + 2 * 2) * 16 * 256 * 4,      // flash fp32 dq/dk/dv
                                4 * 256 * 4,                     // flash delta
                                256 * 64 * 2, 2 * 256 * 32 * 2,  // dq, dk, dv
                                256 * 64 * 2 + 256 * 32 * 2,     // after RoPE
                                256 * 64 * 2 + 256 * 32 * 2,     // before the QK-norm
                                256 * 64 * 2});                  // da
  const BlockBytes none = attention_bytes(a, 64, batch(Recompute::none));
  const BlockBytes sel = attention_bytes(a, 64, batch(Recompute::selective));
  const BlockBytes full = attention_bytes(a, 64, batch(Recompute::full));
  EXPECT_EQ(i64(none.saved), kept + cheap);
  EXPECT_EQ(i64(none.recomputed), 0);
  EXPECT_EQ(i64(sel.saved), kept);
  EXPECT_EQ(i64(sel.recomputed), cheap);
  EXPECT_EQ(i64(full.saved), 0);
  EXPECT_EQ(i64(full.recomputed), kept + cheap);
  for (const BlockBytes& r : {none, sel, full}) EXPECT_EQ(i64(r.backward), backward);
  BlockBatch det = batch(Recompute::selective);
  det.deterministic = true;  // every query head's dK and dV sums
  EXPECT_EQ(i64(attention_bytes(a, 64, det).backward), backward + 2 * (4 - 2) * 16 * 256 * 4);
}

// NoPE without a QK-norm (Nemotron-H's attention): the block attends over q and k themselves (qr, kr are no copies)
// and hands flash's dq, dk to the projections as they are; with a QK-norm, its output and its gradient are copies
// again.
TEST(BlockCosts, AttentionWithoutRopeKeepsNoRotatedCopies) {
  AttentionSpec a = mixed_spec().attention[0];  // 4 / 2 heads of 16, QK-norm
  a.rope.kind = RopeKind::none;
  const int64_t kept = sum({256 * 64 * 2, 256 * 32 * 2, 256 * 32 * 2, 256 * 64 * 2, 4 * 256 * 4});  // q k v o lse
  const int64_t qk = 256 * 64 * 2 + 256 * 32 * 2;
  const int64_t backward = sum({256 * 64 * 2,                               // d(o)
                                (4 + 2 * 2) * 16 * 256 * 4 + 4 * 256 * 4,  // flash fp32 sums, delta
                                256 * 64 * 2, 2 * 256 * 32 * 2,             // dq, dk, dv
                                256 * 64 * 2});                             // da
  const BlockBytes normed = attention_bytes(a, 64, batch(Recompute::none));
  EXPECT_EQ(i64(normed.saved), kept + 256 * 64 * 2 + qk);
  EXPECT_EQ(i64(normed.backward), backward + 2 * qk);
  a.qk_norm = false;
  const BlockBytes none = attention_bytes(a, 64, batch(Recompute::none));
  const BlockBytes sel = attention_bytes(a, 64, batch(Recompute::selective));
  EXPECT_EQ(i64(none.saved), kept + 256 * 64 * 2);  // and a
  EXPECT_EQ(i64(sel.saved), kept);
  EXPECT_EQ(i64(sel.recomputed), 256 * 64 * 2);  // a alone
  EXPECT_EQ(i64(none.backward), backward);
  EXPECT_EQ(i64(attention_rope_table_bytes(a, 256)), 0);
}

TEST(BlockCosts, AttentionValueDimWindowAndRopeTables) {
  AttentionSpec a = mixed_spec().attention[0];  // 4 / 2 heads of 16
  a.v_head_dim = 8;
  const BlockBytes r = attention_bytes(a, 64, batch(Recompute::selective));
  EXPECT_EQ(i64(r.saved), sum({256 * 64 * 2, 256 * 32 * 2, 256 * 16 * 2 /*v*/, 256 * 32 * 2 /*o*/, 4 * 256 * 4}));
  // Projections q 64·64, k 32·64, v 16·64, o 64·32; scores and values at seq 128: 64 keys per query on average.
  EXPECT_EQ(attention_flops_per_token(a, 64, 128), 2.0 * (4096 + 2048 + 1024 + 2048) + 2.0 * 64 * 4 * (16 + 8));
  a.v_head_dim = 0;
  a.sliding_window = 32;  // (128² / 2 - 96² / 2) / 128 = 28 keys per query on average
  EXPECT_EQ(attention_flops_per_token(a, 64, 128), 2.0 * (4096 + 2048 + 2048 + 4096) + 2.0 * 28 * 4 * 32);
  a.sliding_window = 4096;  // wider than the sequence: causal
  EXPECT_EQ(attention_flops_per_token(a, 64, 128), 2.0 * (4096 + 2048 + 2048 + 4096) + 2.0 * 64 * 4 * 32);

  EXPECT_EQ(i64(attention_rope_table_bytes(a, 256)), 2 * 256 * 8 * 4);  // cos, sin: D/2 f32 per token
  a.rope.rotary_dim = 8;
  EXPECT_EQ(i64(attention_rope_table_bytes(a, 256)), 2 * 256 * 4 * 4);
  a.rope.kind = RopeKind::none;
  EXPECT_EQ(i64(attention_rope_table_bytes(a, 256)), 0);
}

TEST(BlockCosts, MlpKeepsWhatTheCudaBlockKeeps) {
  const MlpSpec m = mixed_spec().mlp[1];  // F 96
  const int64_t n = 256 * 64 * 2, gu = 256 * 192 * 2, h = 256 * 96 * 2;
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::none)).saved), n + gu + h);
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::selective)).saved), gu);
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::selective)).recomputed), n + h);
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::full)).saved), 0);
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::full)).recomputed), n + gu + h);
  EXPECT_EQ(i64(mlp_bytes(m, 64, batch(Recompute::none)).backward), gu + h + n);  // d(gu), dh, dn
  EXPECT_EQ(mlp_flops_per_token(m, 64), 2.0 * 3 * 64 * 96);
  MlpSpec relu2 = m;  // up and down only
  relu2.activation = Activation::relu2;
  EXPECT_EQ(i64(mlp_bytes(relu2, 64, batch(Recompute::selective)).saved), 256 * 96 * 2);
  EXPECT_EQ(mlp_flops_per_token(relu2, 64), 2.0 * 2 * 64 * 96);
}

TEST(BlockCosts, MoeKeepsWhatTheCudaBlockKeeps) {
  const MoeSpec m = mixed_spec().moe[1];  // 8 experts top-2, I 48: 512 expert rows
  const int64_t kept = sum({256 * 8 * 2,            // router logits
                            512 * 4 + 512 * 4,      // route index i32, weight f32
                            9 * 4 + 512 * 4 * 2,    // plan: offsets, row_of_slot, slot_of_row
                            512 * 96 * 2,           // gu
                            512 * 64 * 2});         // yd
  const int64_t cheap = sum({256 * 64 * 2, 512 * 64 * 2, 512 * 48 * 2});  // n, xg, h
  const int64_t backward = sum({512 * 64 * 2,   // dyd
                                512 * 48 * 2,   // dh
                                512 * 96 * 2,   // dgu
                                512 * 64 * 2,   // dxg
                                256 * 64 * 2,   // dn
                                512 * 4,        // d(weights) f32
                                256 * 8 * 2});  // d(logits)
  EXPECT_EQ(i64(moe_bytes(m, 64, batch(Recompute::none)).saved), kept + cheap);
  EXPECT_EQ(i64(moe_bytes(m, 64, batch(Recompute::selective)).saved), kept);
  EXPECT_EQ(i64(moe_bytes(m, 64, batch(Recompute::selective)).recomputed), cheap);
  EXPECT_EQ(i64(moe_bytes(m, 64, batch(Recompute::full)).recomputed), kept + cheap);
  EXPECT_EQ(i64(moe_bytes(m, 64, batch(Recompute::none)).backward), backward);
  // all_to_all over 2 ranks: the received rows stay under selective; the dispatch's source-major copy in backward.
  BlockBatch a2a = batch(Recompute::selective);
  a2a.expert_parallel = 2;
  EXPECT_EQ(i64(moe_bytes(m, 64, a2a).saved), kept + 512 * 64 * 2);
  EXPECT_EQ(i64(moe_bytes(m, 64, a2a).backward), backward + 512 * 64 * 2);
  // Paired expert wgrads hold dyd, h, dgu and xg of one micro-batch.
  BlockBatch pair = batch(Recompute::full);
  pair.pair_expert_wgrad = true;
  EXPECT_EQ(i64(moe_bytes(m, 64, pair).saved), 512 * (64 + 48 + 96 + 64) * 2);
  EXPECT_EQ(moe_flops_per_token(m, 64), 2 * 2.0 * 3 * 64 * 48);  // k experts, router left out
  // ReLU² experts (Nemotron-H): up alone, the first GEMM's rows and their gradient I wide instead of 2I.
  MoeSpec relu2 = m;
  relu2.expert.activation = Activation::relu2;
  EXPECT_EQ(i64(moe_bytes(relu2, 64, batch(Recompute::selective)).saved), kept - 512 * 48 * 2);
  EXPECT_EQ(i64(moe_bytes(relu2, 64, batch(Recompute::none)).backward), backward - 512 * 48 * 2);
  EXPECT_EQ(i64(moe_bytes(relu2, 64, pair).saved), 512 * (64 + 48 + 48 + 64) * 2);
  EXPECT_EQ(moe_flops_per_token(relu2, 64), 2 * 2.0 * 2 * 64 * 48);
  relu2.shared_expert = MlpSpec{32, Activation::relu2, false};
  EXPECT_EQ(i64(moe_bytes(relu2, 64, batch(Recompute::selective)).saved), kept - 512 * 48 * 2 + 256 * 32 * 2);
  EXPECT_EQ(moe_flops_per_token(relu2, 64), 2 * 2.0 * 2 * 64 * 48 + 2.0 * 2 * 64 * 32);
  MoeSpec shared = m;
  shared.shared_expert = MlpSpec{32, Activation::swiglu, false};
  EXPECT_EQ(moe_flops_per_token(shared, 64), 2 * 2.0 * 3 * 64 * 48 + 2.0 * 3 * 64 * 32);
  EXPECT_EQ(i64(moe_bytes(shared, 64, batch(Recompute::none)).saved),
            kept + cheap + i64(mlp_bytes(*shared.shared_expert, 64, batch(Recompute::none)).saved));
}

// ---- the sums over a mixed spec ----

TEST(BlockCosts, LayerIsItsInputItsStreamsAndItsBlocks) {
  const DecoderSpec s = mixed_spec();
  const int64_t stream = 256 * 64 * 2;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(r));
    for (int64_t l = 0; l < 4; ++l) {
      const auto& subs = s.layers[static_cast<size_t>(l)].sublayers;
      const BlockBytes a = attention_bytes(s.attention[0], 64, batch(r));
      const BlockBytes f = subs[1].kind == SublayerKind::moe ? moe_bytes(s.moe[subs[1].index], 64, batch(r))
                                                              : mlp_bytes(s.mlp[subs[1].index], 64, batch(r));
      const LayerBytes got = decoder_layer_bytes(s, l, batch(r));
      const bool full = r == Recompute::full;
      EXPECT_EQ(i64(got.saved), stream /*x_in*/ + (full ? 0 : stream /*x_mid*/) + i64(a.saved + f.saved)) << l;
      EXPECT_EQ(i64(got.backward_peak), (full ? stream : 0) + 2 * stream /*dx, dx_mid*/ +
                                            i64(a.recomputed + a.backward + f.recomputed + f.backward))
          << l;
    }
  }
  // Three sublayers: two streams between them.
  DecoderSpec three = s;
  three.layers[0].sublayers = {{SublayerKind::attention, 0}, {SublayerKind::mlp, 1}, {SublayerKind::moe, 0}};
  const int64_t blocks = i64(attention_bytes(s.attention[0], 64, batch(Recompute::none)).saved +
                             mlp_bytes(s.mlp[1], 64, batch(Recompute::none)).saved +
                             moe_bytes(s.moe[0], 64, batch(Recompute::none)).saved);
  EXPECT_EQ(i64(decoder_layer_bytes(three, 0, batch(Recompute::none)).saved), 3 * stream + blocks);
  EXPECT_EQ(i64(decoder_layer_bytes(three, 0, batch(Recompute::full)).saved), stream);
}

TEST(BlockCosts, MemoryPlanSumsEveryLayersBlocks) {
  MemoryPlanInput in;
  in.cfg = mixed_spec();
  in.micro_batch = 2;
  in.seq = 128;
  in.fp32_master = true;
  in.device_bytes = int64_t{1} << 30;
  // After the last layer: final x and its norm, targets and ids i64, RoPE cos + sin (8 f32 each), doc ranges i32.
  const int64_t model_saved = 2 * 256 * 64 * 2 + 2 * 256 * 8 + 2 * 256 * 8 * 4 + 2 * 256 * 4;
  const int64_t head_loss = 256 * 512 * 2 + 256 * 4 + 256 * 64 * 2 + 2 * 256 * 64 * 2;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(r));
    in.recompute = r;
    const MemoryPlan p = memory_plan(in);
    int64_t saved = model_saved, peak = head_loss;
    std::vector<int64_t> layer_saved;
    for (int64_t l = 0; l < 4; ++l) {
      const LayerBytes lb = decoder_layer_bytes(in.cfg, l, batch(r));
      layer_saved.push_back(i64(lb.saved));
      saved += i64(lb.saved);
      peak = std::max(peak, i64(lb.backward_peak));
    }
    EXPECT_EQ(p.activations_saved, saved);
    EXPECT_EQ(p.activations_transient, peak);
    EXPECT_EQ(p.moe_layers, 2);
    if (r != Recompute::full) {  // the layers differ by their feed-forward blocks only
      EXPECT_EQ(layer_saved[2] - layer_saved[0],
                i64(moe_bytes(in.cfg.moe[1], 64, batch(r)).saved - moe_bytes(in.cfg.moe[0], 64, batch(r)).saved));
      EXPECT_EQ(layer_saved[1] - layer_saved[3],
                i64(mlp_bytes(in.cfg.mlp[0], 64, batch(r)).saved - mlp_bytes(in.cfg.mlp[1], 64, batch(r)).saved));
    }
  }
}

TEST(BlockCosts, FlopsSumTheBlocksAndTheHead) {
  const DecoderSpec s = mixed_spec();
  for (int64_t seq : {128, 1000, 4096}) {
    SCOPED_TRACE(seq);
    const double attention = 2.0 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64) + 2.0 * (seq / 2.0) * 4 * (16 + 16);
    const double moe0 = 2 * 2.0 * 3 * 64 * 32, moe1 = 2 * 2.0 * 3 * 64 * 48;
    const double mlp0 = 2.0 * 3 * 64 * 128, mlp1 = 2.0 * 3 * 64 * 96;
    const double head = 2.0 * 512 * 64;
    const double forward = head + 4 * attention + moe0 + mlp0 + moe1 + mlp1;
    EXPECT_EQ(decoder_flops_per_token(s, seq), forward);
    EXPECT_EQ(decoder_train_flops_per_token(s, seq), 3 * forward);
  }
}

// gpt-oss-20b sliced to 5 layers: layers 0, 2, 4 slide over 128 keys, layers 1, 3 attend causally, so their
// attention cores differ. At seq 4096 a sliding layer's queries meet (4096² − 3968²) / 2 / 4096 = 126 keys on
// average, a causal layer's 2048. Every term is an integer below 2^53: the sums are exact in any order. The train
// total is the number bench/hf_baseline.py --family gpt-oss --print-flops --layers 5 --seq 4096 prints.
TEST(BlockCosts, GptOssSlidingLayersCountOnlyTheKeysInTheirWindow) {
  nlohmann::json j = preset_config_json("gpt-oss-20b");
  config_json_set_layers(j, 5);
  const DecoderSpec s = DecoderSpec::from_json(j, "gpt-oss-20b");
  for (int64_t l = 0; l < 5; ++l) EXPECT_EQ(s.attention_of(l)->sliding_window, l % 2 == 0 ? 128 : 0) << l;
  const double H = 2880, Hq = 64, Hkv = 8, D = 64, I = 2880, V = 201088;
  const double proj = 2.0 * (H * Hq * D + H * Hkv * D + H * Hkv * D + Hq * D * H);
  const double experts = 4 * 2.0 * 3 * H * I;  // top-4, router left out
  const auto core = [&](double keys) { return 2.0 * keys * Hq * (D + D); };
  const double forward = 2.0 * V * H + 5 * (proj + experts) + 3 * core(126) + 2 * core(2048);
  EXPECT_EQ(decoder_flops_per_token(s, 4096), forward);
  EXPECT_EQ(decoder_train_flops_per_token(s, 4096), 7476953088.0);
  // A sequence no longer than the window: every layer is causal.
  EXPECT_EQ(decoder_flops_per_token(s, 128), 2.0 * V * H + 5 * (proj + experts) + 5 * core(64));
  // Between: 200 tokens, (200² − 72²) / 2 / 200 = 87.04 keys per query on the sliding layers.
  EXPECT_DOUBLE_EQ(decoder_flops_per_token(s, 200),
                   2.0 * V * H + 5 * (proj + experts) + 3 * core(87.04) + 2 * core(100));
}

TEST(BlockCosts, RopeTablesOnePerAttentionConfigurationInUse) {
  DecoderSpec s = mixed_spec();
  AttentionSpec wide = s.attention[0];
  wide.head_dim = 32;
  s.attention.push_back(wide);     // used by layer 3
  s.attention.push_back(wide);     // used by no layer
  s.layers[3].sublayers[0].index = 1;
  EXPECT_EQ(i64(decoder_rope_table_bytes(s, 256)), 2 * 256 * 8 * 4 + 2 * 256 * 16 * 4);
  // Layer 3's attention is counted with its own dims.
  const double fpt = decoder_flops_per_token(s, 128) - decoder_flops_per_token(mixed_spec(), 128);
  EXPECT_EQ(fpt, 2.0 * (64 * 128 + 64 * 64 + 64 * 64 + 128 * 64) - 2.0 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64) +
                     2.0 * 64 * 4 * (32 + 32) - 2.0 * 64 * 4 * (16 + 16));
}

// The Mamba2 mixer as its CUDA block keeps it (layers/cuda/mamba2_mixer_block_cuda.h), at 4 heads of 8, 2 groups of
// state 16, conv 4, chunk 16 on hidden 64: Di 32, C = 32 + 2·2·16 = 96, in_proj width 32 + 96 + 4 = 132; T = 256.
TEST(BlockCosts, Mamba2KeepsWhatTheCudaBlockKeeps) {
  Mamba2Spec m;
  m.heads = 4, m.head_dim = 8, m.groups = 2, m.state = 16, m.conv_kernel = 4, m.chunk = 16;
  const int64_t n = 256 * 64 * 2, proj = 256 * 132 * 2, act = 256 * 96 * 2, dt = 256 * 4 * 4, y = 256 * 32 * 4,
                g = 256 * 32 * 2, states = 4 * 4 * 8 * 16 * 4;  // the CUDA scan's 4 chunks of 64: [heads, P, N] fp32
  const int64_t scan_backward = states + 4 * 2 * 64 * 64 * 4;                // their gradients, C·Bᵀ per (chunk, group)
  EXPECT_EQ(i64(mamba2_scan_states_bytes(m, 256)), states);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::none)).saved), proj + y + states + n + act + dt + g);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::selective)).saved), proj + y + states);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::selective)).recomputed), n + act + dt + g);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::full)).saved), 0);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::full)).recomputed), proj + y + states + n + act + dt + g);
  EXPECT_EQ(i64(mamba2_bytes(m, 64, batch(Recompute::none)).backward), g + proj + y + act + dt + n + scan_backward);
  // in_proj + out_proj, the conv's 4 taps on 96 channels, the scan (2 groups x 2·16·16, 4 heads x (2·16·8 + 4·8·16)).
  EXPECT_EQ(mamba2_flops_per_token(m, 64), 2.0 * 64 * 132 + 2.0 * 32 * 64 + 2.0 * 96 * 4 + 2 * 2.0 * 16 * 16 +
                                               4 * (2.0 * 16 * 8 + 4.0 * 8 * 16));
  // In a model: layer 1's MLP replaced by the mixer counts it.
  DecoderSpec s = mixed_spec();
  s.mamba2.push_back(m);
  s.layers[1].sublayers[1] = {SublayerKind::mamba2, 0};
  EXPECT_EQ(decoder_flops_per_token(s, 128) - decoder_flops_per_token(mixed_spec(), 128),
            mamba2_flops_per_token(m, 64) - mlp_flops_per_token(mixed_spec().mlp[0], 64));
}

// MLA is counted as its CUDA block (layers/cuda/mla_attention_block_cuda.h) keeps it: the FLOPs of its five
// projections and of the scores at qk 32 / v 16 by hand, the bytes of its saved tensors (here with a q LoRA of 16, kv
// LoRA 16, rope 8; flash attention runs qk 32 with the value zero-padded to 32, so o is 32 wide and o without its
// padding is kept too), and at DeepSeek-V3's 192 / 128, which the kernels run without padding.
TEST(BlockCosts, MlaIsCountedAsItsCudaBlockKeepsIt) {
  AttentionSpec a;
  a.kind = AttentionKind::mla;
  a.heads = 4;
  a.kv_heads = 4;
  a.q_lora_rank = 16;
  a.kv_lora_rank = 16;
  a.qk_nope_head_dim = 24;
  a.qk_rope_head_dim = 8;
  a.head_dim = 32;
  a.v_head_dim = 16;
  a.rope.rotary_dim = 8;
  EXPECT_EQ(mla_flash_value_dim(a), 32);
  const double proj = 64.0 * 16 + 16.0 * 4 * 32 + 64.0 * (16 + 8) + 16.0 * 4 * (24 + 16) + 4.0 * 16 * 64;
  EXPECT_EQ(attention_flops_per_token(a, 64, 128), 2.0 * proj + 2.0 * 64 * 4 * (32 + 16));
  a.q_lora_rank = 0;  // a plain q_proj
  EXPECT_EQ(attention_flops_per_token(a, 64, 128),
            2.0 * (64.0 * 4 * 32 + 64.0 * 24 + 16.0 * 160 + 64.0 * 64) + 2.0 * 64 * 4 * 48);
  a.q_lora_rank = 16;
  const int64_t T = 256;
  const int64_t kept = sum({T * 16 * 2,            // q latent
                            T * 128 * 2,           // q
                            T * 24 * 2,            // kv_a output
                            T * 160 * 2,           // kv_b output
                            T * 4 * 32 * 2,        // o, value width padded to 32
                            T * 4 * 16 * 2,        // o without the padding (o_proj's input)
                            4 * T * 4});           // lse
  const int64_t cheap = sum({T * 64 * 2,                // a
                             T * 16 * 2,                // q latent normed
                             T * 16 * 2, T * 16 * 2,    // kv latent, normed
                             T * 128 * 2, T * 128 * 2,  // query, key
                             T * 4 * 32 * 2});          // value (padded)
  EXPECT_EQ(i64(attention_bytes(a, 64, batch(Recompute::none)).saved), kept + cheap);
  EXPECT_EQ(i64(attention_bytes(a, 64, batch(Recompute::selective)).saved), kept);
  EXPECT_EQ(i64(attention_bytes(a, 64, batch(Recompute::full)).recomputed), kept + cheap);
  EXPECT_EQ(i64(attention_rope_table_bytes(a, T)), 2 * T * 4 * 4);  // the 8 rope dims only

  // DeepSeek-V3's head sizes: no padding, o is o_proj's input.
  a.qk_nope_head_dim = 128;
  a.qk_rope_head_dim = 64;
  a.head_dim = 192;
  a.v_head_dim = 128;
  a.rope.rotary_dim = 64;
  a.kv_lora_rank = 64;
  EXPECT_EQ(mla_flash_value_dim(a), 128);
  const int64_t kept192 = sum({T * 16 * 2, T * 4 * 192 * 2, T * (64 + 64) * 2, T * 4 * 256 * 2, T * 4 * 128 * 2,
                               4 * T * 4});
  EXPECT_EQ(i64(attention_bytes(a, 64, batch(Recompute::selective)).saved), kept192);
  a.v_head_dim = 256;  // a value wider than the keys: no kernel
  EXPECT_EQ(mla_flash_value_dim(a), 0);
}

}  // namespace
}  // namespace mt
