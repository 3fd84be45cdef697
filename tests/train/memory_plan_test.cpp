// The memory plan against byte counts worked out by hand, tensor by tensor, for the qwen3-moe-test
// shapes (hidden 64, 2 layers, 8 experts top-2, moe_intermediate 32, vocab 512, head_dim 16, 4/2 heads),
// and against the Qwen3-30B-A3B 12-layer slice of anchors.md.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/lora_adapter.h"
#include "models/presets.h"
#include "train/memory_plan.h"

namespace mt {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kH200Bytes = 143771566080;  // cudaMemGetInfo total of an H200
constexpr int64_t kH200Reserve = 3 * kGiB / 2 + kH200Bytes * 3 / 100;

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

DecoderSpec preset(const char* name, int64_t layers = 0) {
  nlohmann::json j = preset_config_json(name);
  if (layers > 0) j["num_hidden_layers"] = layers;
  return DecoderSpec::from_json(j, name);
}

// qwen3-moe-test at micro_batch 2 x seq 128: T = 256 tokens, Tk = T * top_k = 512 expert slots.
MemoryPlanInput tiny_input(Recompute r) {
  MemoryPlanInput in;
  in.cfg = preset("qwen3-moe-test");
  in.micro_batch = 2;
  in.seq = 128;
  in.recompute = r;
  in.fp32_master = true;
  in.bf16_moments = false;
  in.device_bytes = kGiB;
  in.reserve_bytes = 0;
  return in;
}

// Parameters of qwen3-moe-test, per tensor.
const int64_t kTinyParams = sum({
    512 * 64,  // embed_tokens
    512 * 64,  // lm_head (untied)
    64,        // final norm
    2 * sum({
            64 * 64,           // q_proj: 4 heads x 16
            32 * 64,           // k_proj: 2 heads x 16
            32 * 64,           // v_proj
            64 * 64,           // o_proj
            16, 16,            // q_norm, k_norm
            64, 64,            // input, post-attention norms
            8 * 64,            // router
            8 * 2 * 32 * 64,   // experts gate_up
            8 * 64 * 32,       // experts down
        }),
});

// Saved per MoE layer at T = 256 with recompute none; marked (s) the tensors selective drops.
const int64_t kLayerKeptBySelective = sum({
    256 * 64 * 2,       // x_in
    256 * 64 * 2,       // q
    256 * 32 * 2,       // k
    256 * 32 * 2,       // v
    256 * 64 * 2,       // o
    4 * 256 * 4,        // lse f32
    256 * 64 * 2,       // x_mid
    256 * 8 * 2,        // router logits
    512 * 4 + 512 * 4,  // route index i32 + weight f32
    9 * 4,              // plan offsets (E + 1) i32
    512 * 4 + 512 * 4,  // row_of_slot, slot_of_row
    512 * 64 * 2,       // gu = 2 x 32
    512 * 64 * 2,       // yd
});
const int64_t kLayerDroppedBySelective = sum({
    256 * 64 * 2,  // a (s)
    256 * 64 * 2,  // qr (s)
    256 * 32 * 2,  // kr (s)
    256 * 64 * 2,  // n (s)
    512 * 64 * 2,  // xg (s)
    512 * 32 * 2,  // h (s)
});
const int64_t kLayerNone = kLayerKeptBySelective + kLayerDroppedBySelective;
const int64_t kLayerInput = 256 * 64 * 2;
// After the last layer: final x, final-norm output, targets i64, input ids i64, rope cos + sin
// (8 f32 per token each), doc start + end i32.
const int64_t kModelSaved = 256 * 64 * 2 * 2 + 256 * 8 + 256 * 8 + 2 * 256 * 8 * 4 + 2 * 256 * 4;

// One MoE layer's backward buffers.
const int64_t kLayerBackward = sum({
    512 * 64 * 2,               // dyd
    512 * 32 * 2,               // dh
    512 * 64 * 2,               // dgu
    512 * 64 * 2,               // dxg
    256 * 64 * 2,               // dn
    512 * 4,                    // dweights f32
    256 * 8 * 2,                // dlogits
    256 * 64 * 2,               // do
    (4 + 2 * 2) * 16 * 256 * 4, // flash fp32 dq/dk/dv accumulators
    4 * 256 * 4,                // flash delta
    256 * 64 * 2,               // dq
    256 * 32 * 2 * 2,           // dk, dv
    256 * 64 * 2 + 256 * 32 * 2, // dqn, dkn
    256 * 64 * 2 + 256 * 32 * 2, // dq, dk before q/k-norm
    256 * 64 * 2,               // da
    2 * 256 * 64 * 2,           // two residual-gradient buffers
});
// LM head + loss: a bf16 chunk of min(4096, 256) rows x 512 logits (gradient written in place); row loss
// f32; dx.
const int64_t kHeadLoss = 256 * 512 * 2 + 256 * 4 + 256 * 64 * 2;

TEST(MemoryPlan, TinyParamsGradsOptimizerExact) {
  MemoryPlan p = memory_plan(tiny_input(Recompute::selective));
  EXPECT_EQ(kTinyParams, 189824);
  EXPECT_EQ(p.param_count, kTinyParams);
  EXPECT_EQ(p.params, kTinyParams * 2);
  EXPECT_EQ(p.grads, kTinyParams * 4);
  EXPECT_EQ(p.optimizer, kTinyParams * (4 + 4 + 4));  // fp32 m, v, master
  EXPECT_EQ(p.workspace, (32 + 256) * (int64_t{1} << 20));

  MemoryPlanInput in = tiny_input(Recompute::selective);
  in.bf16_moments = true;
  in.fp32_master = false;
  EXPECT_EQ(memory_plan(in).optimizer, kTinyParams * (2 + 2));
  in.fp32_master = true;
  EXPECT_EQ(memory_plan(in).optimizer, kTinyParams * (2 + 2 + 4));

  // bf16 expert gradients: the stacked expert weights (2 layers x (gate_up 8x64x64 + down 8x64x32)) at 2 bytes.
  MemoryPlanInput bg = tiny_input(Recompute::selective);
  bg.bf16_expert_grads = true;
  EXPECT_EQ(memory_plan(bg).grads, kTinyParams * 4 - 2 * (8 * 2 * 32 * 64 + 8 * 64 * 32) * 2);

  in.cfg.tie_word_embeddings = true;  // no lm_head
  EXPECT_EQ(memory_plan(in).param_count, kTinyParams - 512 * 64);
}

// LoRA: the frozen base keeps its bf16 parameters only; the adapter (fp32) and the full-trained router carry
// gradients and moments (the router, bf16, also its fp32 master); activations as in full training.
TEST(MemoryPlan, LoraFreezesTheBase) {
  MemoryPlanInput in = tiny_input(Recompute::selective);
  const MemoryPlan full = memory_plan(in);
  in.lora = true;
  in.lora_params = 12345;
  in.lora_full_params = 2 * 8 * 64;  // two routers [E 8, H 64]
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.params, kTinyParams * 2 + 12345 * 4);
  EXPECT_EQ(p.grads, (12345 + 1024) * 4);
  EXPECT_EQ(p.optimizer, (12345 + 1024) * 8 + 1024 * 4);
  EXPECT_EQ(p.activations, full.activations);
  EXPECT_EQ(p.total, p.params + p.grads + p.optimizer + p.activations + p.workspace);
  EXPECT_NE(p.table().find("bf16 base (frozen) + fp32 adapter"), std::string::npos) << p.table();
  in.expert_parallel = 2;
  EXPECT_THROW(memory_plan(in), Error);
}

// On the GPU every adapted weight keeps its u = x·A'ᵀ, BF16 [T, r], for the backward: the Mamba2 mixer's in_proj
// too (layers/cuda/mamba2_mixer_block_cuda.h), a dense slot's r values a token, an expert stack's k·r.
TEST(MemoryPlan, LoraCountsEveryAdaptedSlotsUOnTheGpu) {
  MemoryPlanInput in;
  in.cfg = DecoderSpec::from_file(std::string(MIXTUNE_SOURCE_DIR) +
                                  "/tests/fixtures/nemotron_h/hybrid_all_kinds/ckpt/config.json");  // M E M * E -
  LoraConfig c;
  c.r = 8;
  c.alpha = 16;
  c.target = {"in_proj", "q_proj"};
  memory_plan_set_lora(in, lora_table_of(in.cfg, c, "test"), /*gpu=*/true);
  EXPECT_EQ(in.lora_saved_per_token, 3 * 8 * 2);  // 2 Mamba2 layers' in_proj + 1 attention q_proj, r 8, 2 bytes
  EXPECT_EQ(in.lora_transient_per_token, 0);          // no expert stack
  c.target = {"in_proj", "experts"};
  memory_plan_set_lora(in, lora_table_of(in.cfg, c, "test"), /*gpu=*/true);
  const int64_t k = in.cfg.experts_per_token();
  EXPECT_EQ(in.lora_saved_per_token, 2 * 8 * 2 + 2 * 2 * k * 8 * 2);  // + 2 MoE layers x 2 stacks x k·r
  memory_plan_set_lora(in, lora_table_of(in.cfg, c, "test"), /*gpu=*/false);
  EXPECT_EQ(in.lora_saved_per_token, 0);  // the CPU engine's activations are not planned here
}

TEST(MemoryPlan, TinyActivationsExactPerRecomputeMode) {
  // none: one layer's backward (698,368) beats the head/loss transient (295,936).
  MemoryPlan none = memory_plan(tiny_input(Recompute::none));
  EXPECT_EQ(none.activations_saved, kModelSaved + 2 * kLayerNone);
  EXPECT_EQ(kLayerBackward, 698368);
  EXPECT_EQ(kHeadLoss, 295936);
  EXPECT_EQ(none.activations_transient, kLayerBackward);
  EXPECT_EQ(none.activations, 1136712 + 698368);

  // selective: the dropped tensors come back for one layer's backward.
  MemoryPlan sel = memory_plan(tiny_input(Recompute::selective));
  EXPECT_EQ(sel.activations_saved, kModelSaved + 2 * kLayerKeptBySelective);
  EXPECT_EQ(kLayerDroppedBySelective + kLayerBackward, 911360);
  EXPECT_EQ(sel.activations_transient, 911360);
  EXPECT_EQ(sel.activations, 710728 + 911360);

  // full: only x_in per layer; backward re-materialises the rest of one layer, which now dominates.
  MemoryPlan full = memory_plan(tiny_input(Recompute::full));
  EXPECT_EQ(full.activations_saved, kModelSaved + 2 * kLayerInput);
  EXPECT_EQ(full.activations_transient, kLayerNone - kLayerInput + kLayerBackward);
  EXPECT_EQ(full.activations, 153600 + 1189924);

  for (const MemoryPlan* p : {&none, &sel, &full}) {
    EXPECT_EQ(p->total, p->params + p->grads + p->optimizer + p->activations + p->workspace);
    EXPECT_EQ(p->available, kGiB);
    EXPECT_TRUE(p->fits);
    EXPECT_EQ(p->refusal(), "");
  }
}

TEST(MemoryPlan, DeterministicFlashBackwardKeepsEveryQueryHeadsDkDv) {
  MemoryPlanInput in = tiny_input(Recompute::none);
  const MemoryPlan base = memory_plan(in);
  in.deterministic = true;
  const MemoryPlan det = memory_plan(in);
  // The fp32 dK and dV workspace of one layer's attention backward grows from Hkv = 2 to Hq = 4 heads:
  // 2 buffers x T 256 x (4 - 2) heads x head_dim 16 x 4 bytes.
  EXPECT_EQ(det.activations_transient - base.activations_transient, 2 * 256 * (4 - 2) * 16 * 4);
  EXPECT_EQ(det.activations_saved, base.activations_saved);
}

TEST(MemoryPlan, PairedExpertWgradHoldsOneMicroBatchPerMoeLayer) {
  MemoryPlanInput in = tiny_input(Recompute::selective);
  const MemoryPlan base = memory_plan(in);
  in.pair_expert_wgrad = true;
  const MemoryPlan paired = memory_plan(in);
  // 2 MoE layers x T·k = 256·2 slots x (dyd H + xg H + h I + dgu 2I = 64 + 64 + 32 + 64) bf16.
  EXPECT_EQ(paired.activations_saved - base.activations_saved, 2 * 512 * (2 * 64 + 3 * 32) * 2);
  EXPECT_EQ(paired.activations_transient, base.activations_transient);
}

TEST(MemoryPlan, ExpertParallelHoldsItsShareOfTheExperts) {
  MemoryPlanInput in = tiny_input(Recompute::selective);
  const MemoryPlan one = memory_plan(in);
  in.expert_parallel = 2;
  const MemoryPlan two = memory_plan(in);
  // 2 layers x (gate_up 8x64x64 + down 8x64x32) expert weights; each of 2 ranks holds 4 of the 8 experts.
  const int64_t experts = 2 * (8 * 2 * 32 * 64 + 8 * 64 * 32);
  EXPECT_EQ(two.param_count, kTinyParams - experts / 2);
  EXPECT_EQ(two.params, (kTinyParams - experts / 2) * 2);
  EXPECT_EQ(two.grads, (kTinyParams - experts / 2) * 4);
  EXPECT_EQ(two.optimizer, (kTinyParams - experts / 2) * 12);
  // The received expert rows xg [T·k, H] stay saved per MoE layer; a dispatch's source-major copy is transient.
  EXPECT_EQ(two.activations_saved - one.activations_saved, 2 * 512 * 64 * 2);
  EXPECT_EQ(two.activations_transient - one.activations_transient, 512 * 64 * 2);
  EXPECT_NE(two.table().find("on this rank (experts split over 2 ranks)"), std::string::npos) << two.table();
  // The all-gather dispatch keeps the group's input [2·T, H] bf16 and routing weights [2·T, k] f32 per MoE layer
  // instead; its backward holds the gathered output gradient and the input gradient's partial sums, [2·T, H] each.
  in.ep_all_gather = true;
  const MemoryPlan gathers = memory_plan(in);
  EXPECT_EQ(gathers.params, two.params);
  EXPECT_EQ(gathers.activations_saved - one.activations_saved, 2 * 2 * 256 * (64 * 2 + 2 * 4));
  EXPECT_EQ(gathers.activations_transient - one.activations_transient, 2 * 2 * 256 * 64 * 2);
  // Its row budget (headroom 1.5 here) sizes the expert buffers at 1.5·T·k = 768 rows instead of 512: per MoE layer
  // gu [R, 2I] and yd [R, H] are kept; the backward's peak re-makes xg [R, H] and h [R, I] and holds dyd [R, H],
  // dh [R, I], dgu [R, 2I] and dxg [R, H].
  in.ep_row_headroom = 1.5;
  const MemoryPlan budget = memory_plan(in);
  EXPECT_EQ(budget.activations_saved - gathers.activations_saved, 2 * 256 * (2 * 32 + 64) * 2);
  EXPECT_EQ(budget.activations_transient - gathers.activations_transient, 256 * (3 * 64 + 4 * 32) * 2);
  in.ep_row_headroom = 0.5;  // below 1: the even share
  EXPECT_EQ(memory_plan(in).activations_saved, gathers.activations_saved);
  in.ep_row_headroom = 0;
  in.ep_all_gather = false;
  in.expert_parallel = 9;  // more ranks than experts
  EXPECT_THROW(memory_plan(in), Error);
}

TEST(MemoryPlan, DenseLayerCountsTheDenseMlp) {
  MemoryPlanInput in = tiny_input(Recompute::none);
  in.cfg.layers[0].sublayers[1] = {SublayerKind::mlp, 0};  // layer 0 takes the dense MLP (intermediate_size 128)
  MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.moe_layers, 1);
  const int64_t moe_mlp = 8 * 64 + 8 * 2 * 32 * 64 + 8 * 64 * 32;
  EXPECT_EQ(p.param_count, kTinyParams - moe_mlp + 3 * 128 * 64);
  const int64_t moe_mlp_saved = kLayerNone - sum({
                                                  256 * 64 * 2,  // x_in
                                                  256 * 64 * 2,  // a
                                                  256 * 64 * 2,  // q
                                                  256 * 32 * 2,  // k
                                                  256 * 64 * 2,  // qr
                                                  256 * 32 * 2,  // kr
                                                  256 * 32 * 2,  // v
                                                  256 * 64 * 2,  // o
                                                  4 * 256 * 4,   // lse
                                              });
  const int64_t dense_mlp_saved = sum({256 * 64 * 2,    // x_mid
                                       256 * 64 * 2,    // n
                                       256 * 256 * 2,   // gate_up
                                       256 * 128 * 2}); // h
  EXPECT_EQ(p.activations_saved, kModelSaved + 2 * kLayerNone - moe_mlp_saved + dense_mlp_saved);
}

// A dense Qwen3 of the tiny shapes (intermediate_size 128, no experts): every layer holds what the CUDA dense
// MLP block (layers/cuda/mlp_block_cuda.h) keeps, x_mid, n, gate|up [T, 2F], h [T, F] (selective drops n and
// h), and its backward allocates d(gate|up), dh and dn.
TEST(MemoryPlan, DenseQwen3CountsTheCudaMlpBlock) {
  nlohmann::json j = preset_config_json("qwen3-moe-test");
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                        "mlp_only_layers", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"})
    j.erase(k);
  MemoryPlanInput in = tiny_input(Recompute::selective);
  in.cfg = DecoderSpec::from_json(j, "dense");
  ASSERT_EQ(in.cfg.num_experts(), 0);
  const int64_t attention_kept = sum({256 * 64 * 2,  // x_in
                                      256 * 64 * 2,  // q
                                      256 * 32 * 2,  // k
                                      256 * 32 * 2,  // v
                                      256 * 64 * 2,  // o
                                      4 * 256 * 4}); // lse
  const int64_t attention_dropped = sum({256 * 64 * 2, 256 * 64 * 2, 256 * 32 * 2});  // a, qr, kr
  const int64_t mlp_kept = sum({256 * 64 * 2,     // x_mid
                                256 * 256 * 2});  // gate|up
  const int64_t mlp_dropped = sum({256 * 64 * 2,    // n
                                   256 * 128 * 2}); // h
  const int64_t attention_backward = sum({256 * 64 * 2,                   // do
                                          (4 + 2 * 2) * 16 * 256 * 4,     // flash fp32 dq/dk/dv
                                          4 * 256 * 4,                    // flash delta
                                          256 * 64 * 2, 256 * 32 * 2 * 2, // dq, dk, dv
                                          256 * 64 * 2 + 256 * 32 * 2,    // dqn, dkn
                                          256 * 64 * 2 + 256 * 32 * 2,    // before q/k-norm
                                          256 * 64 * 2,                   // da
                                          2 * 256 * 64 * 2});             // residual grads
  const int64_t mlp_backward = sum({256 * 256 * 2,  // d(gate|up)
                                    256 * 128 * 2,  // dh
                                    256 * 64 * 2}); // dn
  MemoryPlan sel = memory_plan(in);
  EXPECT_EQ(sel.moe_layers, 0);
  EXPECT_EQ(sel.param_count, kTinyParams - 2 * (8 * 64 + 8 * 2 * 32 * 64 + 8 * 64 * 32) + 2 * 3 * 128 * 64);
  EXPECT_EQ(sel.activations_saved, kModelSaved + 2 * (attention_kept + mlp_kept));
  EXPECT_EQ(sel.activations_transient, attention_dropped + mlp_dropped + attention_backward + mlp_backward);
  in.recompute = Recompute::none;
  MemoryPlan none = memory_plan(in);
  EXPECT_EQ(none.activations_saved, kModelSaved + 2 * (attention_kept + attention_dropped + mlp_kept + mlp_dropped));
  EXPECT_EQ(none.activations_transient, attention_backward + mlp_backward);
}

TEST(MemoryPlan, ActivationsShrinkWithMoreRecompute) {
  for (int64_t seq : {128, 4096}) {
    MemoryPlanInput in = tiny_input(Recompute::none);
    in.seq = seq;
    int64_t none = memory_plan(in).activations;
    in.recompute = Recompute::selective;
    int64_t sel = memory_plan(in).activations;
    in.recompute = Recompute::full;
    int64_t full = memory_plan(in).activations;
    EXPECT_GT(none, sel) << "seq " << seq;
    EXPECT_GT(sel, full) << "seq " << seq;
  }
}

MemoryPlanInput slice_input(bool master, bool bf16_moments) {
  MemoryPlanInput in;
  in.cfg = preset("qwen3-30b-a3b", 12);
  in.micro_batch = 1;
  in.seq = 4096;
  in.recompute = Recompute::selective;
  in.fp32_master = master;
  in.bf16_moments = bf16_moments;
  in.device_bytes = kH200Bytes;
  in.reserve_bytes = kH200Reserve;
  return in;
}

TEST(MemoryPlan, Qwen3_30B_A3B_TwelveLayerSliceFitsOnH200WithBf16State) {
  MemoryPlan p = memory_plan(slice_input(false, true));
  // anchors.md: 12-layer slice = 8.10 B parameters. Exactly: embed + lm_head 2 x 151936 x 2048, final
  // norm 2048, 12 x (attention 18,874,368 + norms 4,352 + router 262,144 + experts 603,979,776).
  EXPECT_EQ(p.param_count, int64_t{8099779584});
  EXPECT_NEAR(static_cast<double>(p.param_count), 8.10e9, 8.10e9 * 0.005);
  EXPECT_EQ(p.layers, 12);
  EXPECT_EQ(p.moe_layers, 12);
  EXPECT_EQ(p.params + p.grads + p.optimizer, p.param_count * (2 + 4 + 2 + 2));  // 75.4 GiB
  EXPECT_TRUE(p.fits) << p.table();
  EXPECT_GT(p.activations, 4 * kGiB);
  EXPECT_LT(p.activations, 6 * kGiB);
  EXPECT_EQ(p.refusal(), "");
  // The searches agree with the plan itself: the reported maxima fit, one step more does not.
  MemoryPlanInput in = slice_input(false, true);
  in.micro_batch = p.max_micro_batch;
  EXPECT_TRUE(memory_plan(in).fits);
  in.micro_batch = p.max_micro_batch + 1;
  EXPECT_FALSE(memory_plan(in).fits);
  in.micro_batch = 1;
  EXPECT_EQ(p.max_seq % 128, 0);
  EXPECT_GE(p.max_seq, 4096);
  in.seq = p.max_seq;
  EXPECT_TRUE(memory_plan(in).fits);
  in.seq = p.max_seq + 128;
  EXPECT_FALSE(memory_plan(in).fits);

  std::string t = p.table();
  EXPECT_NE(t.find("8.10 B parameters"), std::string::npos) << t;
  EXPECT_NE(t.find("recompute selective"), std::string::npos) << t;
  EXPECT_NE(t.find("fits: largest micro_batch at seq 4096: " + std::to_string(p.max_micro_batch)), std::string::npos)
      << t;
}

TEST(MemoryPlan, Qwen3_30B_A3B_TwelveLayerSliceRefusesFp32MasterAndMoments) {
  // 2 + 4 + 12 = 18 bytes per parameter = 135.8 GiB before activations: past the whole GPU.
  MemoryPlan p = memory_plan(slice_input(true, false));
  EXPECT_EQ(p.params + p.grads + p.optimizer, p.param_count * 18);
  EXPECT_GT(p.params + p.grads + p.optimizer, kH200Bytes);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.max_micro_batch, 0);
  EXPECT_EQ(p.max_seq, 0);
  std::string r = p.refusal();
  EXPECT_EQ(r.rfind("does not fit: needs 141.17 GiB of 128.38 GiB available", 0), 0u) << r;
  EXPECT_NE(r.find("no micro_batch fits at seq 4096; no seq fits at micro_batch 1"), std::string::npos) << r;
  EXPECT_EQ(r.find("train.recompute: full"), std::string::npos) << r;  // recompute cannot save this one
  EXPECT_NE(r.find("or set optimizer.master_weights: none"), std::string::npos) << r;
  EXPECT_EQ(r.find('\n'), std::string::npos);
}

TEST(MemoryPlan, RefusalNamesLargestMicroBatchAndSeq) {
  MemoryPlanInput in = slice_input(false, true);
  in.recompute = Recompute::none;
  in.micro_batch = 16;
  MemoryPlan p = memory_plan(in);
  ASSERT_FALSE(p.fits);
  ASSERT_GT(p.max_micro_batch, 0);
  ASSERT_GT(p.max_seq, 0);
  std::string r = p.refusal();
  EXPECT_NE(r.find("largest micro_batch that fits at seq 4096: " + std::to_string(p.max_micro_batch) + ";"),
            std::string::npos) << r;
  EXPECT_NE(r.find("largest seq at micro_batch 16: " + std::to_string(p.max_seq)), std::string::npos) << r;
  EXPECT_NE(r.find("; or set train.recompute: full"), std::string::npos) << r;
  EXPECT_EQ(r.find("master_weights"), std::string::npos) << r;  // there is no master to drop

  MemoryPlanInput at = in;
  at.micro_batch = p.max_micro_batch;
  EXPECT_TRUE(memory_plan(at).fits);
  at.micro_batch = p.max_micro_batch + 1;
  EXPECT_FALSE(memory_plan(at).fits);
  at = in;
  at.seq = p.max_seq;
  EXPECT_TRUE(memory_plan(at).fits);
  at.seq = p.max_seq + 128;
  EXPECT_FALSE(memory_plan(at).fits);
  at = in;
  at.recompute = Recompute::full;
  EXPECT_TRUE(memory_plan(at).fits);
}

TEST(MemoryPlan, RecomputeParse) {
  EXPECT_EQ(recompute_parse("none", "w"), Recompute::none);
  EXPECT_EQ(recompute_parse("selective", "w"), Recompute::selective);
  EXPECT_EQ(recompute_parse("full", "w"), Recompute::full);
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    EXPECT_EQ(recompute_parse(recompute_name(r), "w"), r);
  try {
    recompute_parse("partial", "recipe.yaml: train.recompute");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "recipe.yaml: train.recompute: unknown recompute mode (expected none, selective or full, found "
                 "\"partial\")");
  }
  EXPECT_THROW(recompute_parse("", "w"), Error);
  EXPECT_THROW(recompute_parse("Full", "w"), Error);
  try {
    recompute_parse(std::string("a\nb") + std::string(100, 'x'), "w");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

TEST(MemoryPlan, RejectsBadSizesWithOneLine) {
  auto expect_error = [](MemoryPlanInput in, const std::string& field) {
    try {
      memory_plan(in);
      ADD_FAILURE() << "no error for " << field;
    } catch (const Error& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("memory plan: " + field + " must be in"), std::string::npos) << w;
      EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    }
  };
  MemoryPlanInput in = tiny_input(Recompute::none);
  in.micro_batch = 0;
  expect_error(in, "micro_batch");
  in = tiny_input(Recompute::none);
  in.seq = -5;
  expect_error(in, "seq");
  in.seq = int64_t{1} << 62;  // micro_batch x seq would overflow
  expect_error(in, "seq");
  in = tiny_input(Recompute::none);
  in.device_bytes = 0;
  expect_error(in, "device_bytes");
  in = tiny_input(Recompute::none);
  in.reserve_bytes = in.device_bytes + 1;
  expect_error(in, "reserve_bytes");
  in = tiny_input(Recompute::none);
  in.cfg.hidden_size = 0;
  expect_error(in, "hidden_size");
  in = tiny_input(Recompute::none);
  in.cfg.moe[0].experts_per_token = 9;
  expect_error(in, "num_experts_per_tok");
  expect_error(MemoryPlanInput{}, "num_hidden_layers");  // a default (empty) config
}

TEST(MemoryPlan, NothingFitsWhenParametersAloneAreTooBig) {
  MemoryPlanInput in = tiny_input(Recompute::full);
  in.device_bytes = 1 << 20;  // 1 MiB: below the workspace alone
  MemoryPlan p = memory_plan(in);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.max_micro_batch, 0);
  EXPECT_EQ(p.max_seq, 0);
  EXPECT_NE(p.refusal().find("no micro_batch fits at seq 128"), std::string::npos) << p.refusal();
}

// ZeRO-1 (optimizer_shards): the state of the replicated parameters is counted at the largest rank's share of
// the whole-tensor assignment. 12-layer slice, EP 2, bf16 moments: the replicated parameters (embed, lm_head,
// final norm and 12 × (attention 18,874,368 + norms 4,352 + router 262,144) = 852,022,272) split into two
// exact halves (embed and lm_head on different ranks, the layers' tensors alternating); over 8 ranks the
// embedding (311,164,928) is the largest share.
TEST(MemoryPlan, ShardedOptimizerStateCountsTheLargestShare) {
  MemoryPlanInput in = slice_input(false, true);
  in.expert_parallel = 2;
  const int64_t experts_held = 12 * int64_t{603979776} / 2, replicated = 852022272;
  const MemoryPlan whole = memory_plan(in);
  EXPECT_EQ(whole.optimizer_param_count, experts_held + replicated);
  EXPECT_EQ(whole.optimizer, (experts_held + replicated) * 4);
  EXPECT_EQ(whole.table().find("shard"), std::string::npos) << whole.table();
  in.optimizer_shards = 2;
  const MemoryPlan half = memory_plan(in);
  EXPECT_EQ(half.optimizer_param_count, experts_held + replicated / 2);
  EXPECT_EQ(half.optimizer, (experts_held + replicated / 2) * 4);
  EXPECT_EQ(whole.total - half.total, (replicated / 2) * 4);
  EXPECT_EQ(half.params, whole.params);  // parameters and gradients stay whole
  EXPECT_EQ(half.grads, whole.grads);
  EXPECT_NE(half.table().find("m,v bf16, no master, 1/2 shard"), std::string::npos) << half.table();
  in.expert_parallel = 8;
  in.optimizer_shards = 8;
  EXPECT_EQ(memory_plan(in).optimizer_param_count, 12 * int64_t{603979776} / 8 + int64_t{151936} * 2048);
  // Without expert parallelism the stacked experts are replicated too and sharded with the rest.
  in.expert_parallel = 1;
  in.optimizer_shards = 2;
  const MemoryPlan dp = memory_plan(in);
  EXPECT_LT(dp.optimizer_param_count, dp.param_count / 2 + 603979776);
  EXPECT_GE(dp.optimizer_param_count, (dp.param_count + 1) / 2);
}

// ZeRO-1 of the expert stacks over their replicas (optimizer_shards / expert_parallel > 1): same slice, EP 2. Over
// 4 ranks each expert group has two replicas; the 24 stacks a rank holds (12 gate_up of 201,326,592, 12 down of
// 100,663,296) split exactly in half between them, and the largest replicated share is the embedding's
// (311,164,928: the layers' tensors fill the other two ranks). Over 6 ranks, three replicas: a third each. With
// one copy of each expert group (2 ranks, EP 2) the experts stay whole on their rank.
TEST(MemoryPlan, ExpertStateShardedOverTheReplicasCountsTheRankShare) {
  MemoryPlanInput in = slice_input(false, true);
  in.expert_parallel = 2;
  const int64_t experts_held = 12 * int64_t{603979776} / 2, embed = 311164928;
  in.optimizer_shards = 4;
  const MemoryPlan four = memory_plan(in);
  EXPECT_EQ(four.expert_replicas, 2);
  EXPECT_EQ(four.optimizer_param_count, experts_held / 2 + embed);
  EXPECT_EQ(four.optimizer, (experts_held / 2 + embed) * 4);
  EXPECT_NE(four.table().find("m,v bf16, no master, 1/4 (experts 1/2)"), std::string::npos) << four.table();
  in.optimizer_shards = 6;
  const MemoryPlan six = memory_plan(in);
  EXPECT_EQ(six.expert_replicas, 3);
  EXPECT_EQ(six.optimizer_param_count, experts_held / 3 + embed);
  in.optimizer_shards = 2;
  const MemoryPlan two = memory_plan(in);
  EXPECT_EQ(two.expert_replicas, 1);
  EXPECT_EQ(two.optimizer_param_count, experts_held + 852022272 / 2);
  EXPECT_EQ(two.table().find("(experts 1/"), std::string::npos) << two.table();
  // The parameters and gradients do not change with the optimizer's sharding.
  EXPECT_EQ(four.params, two.params);
  EXPECT_EQ(four.grads, two.grads);
  EXPECT_EQ(two.total - four.total, (two.optimizer_param_count - four.optimizer_param_count) * 4);
}

// ZeRO-3 (shard_parameters): the parameters row holds the rank's share plus two neighbouring fetched groups at
// most: the head (151,936 × 2048 + 2048 = 311,166,976) and a layer's replicated tensors (19,140,864 under EP).
// Same slice as above, EP 2 over 2 ranks: 426,011,136 + 330,307,840 replicated parameters instead of
// 852,022,272. Keeping layers until their backward (reshard_after_forward false) saves nothing, and one rank
// shards nothing.
TEST(MemoryPlan, ShardedParametersHoldTheShareAndTwoFetchedGroups) {
  MemoryPlanInput in = slice_input(false, true);
  in.expert_parallel = 2;
  in.optimizer_shards = 2;
  const int64_t experts_held = 12 * int64_t{603979776} / 2;
  const MemoryPlan zero1 = memory_plan(in);
  EXPECT_EQ(zero1.params, (experts_held + 852022272) * 2);
  in.shard_parameters = true;
  const MemoryPlan zero3 = memory_plan(in);
  EXPECT_EQ(zero3.params, (experts_held + 426011136 + 330307840) * 2);
  EXPECT_EQ(zero1.total - zero3.total, zero1.params - zero3.params);
  EXPECT_EQ(zero3.grads, zero1.grads);  // gradients stay whole
  EXPECT_NE(zero3.table().find("bf16 ZeRO-3: 1/2 + 2 fetched groups"), std::string::npos) << zero3.table();
  in.reshard_after_forward = false;
  EXPECT_EQ(memory_plan(in).params, zero1.params);
  in.reshard_after_forward = true;
  in.optimizer_shards = 1;
  EXPECT_EQ(memory_plan(in).params, zero1.params);

  // Four ranks, EP 2: two copies of each expert group, so ZeRO-3 shards the expert stacks over them too. The rank
  // keeps its owned share (half its experts' stacks, about a quarter of the replicated tensors) and two fetched
  // groups, which are now whole layers with this rank's experts: 19,140,864 + 603,979,776 / 2 = 321,130,752
  // parameters, more than the head.
  in.optimizer_shards = 4;
  const MemoryPlan four = memory_plan(in);
  EXPECT_EQ(four.params, (four.optimizer_param_count + 2 * int64_t{321130752}) * 2);
  EXPECT_LE(four.optimizer_param_count, experts_held / 2 + 852022272 / 4 + 311166976);  // average + largest tensor
  EXPECT_LT(four.params, zero3.params - experts_held / 4 * 2);  // the experts no longer all here
  EXPECT_NE(four.table().find("bf16 ZeRO-3: 1/4 (experts 1/2) + 2 groups"), std::string::npos) << four.table();
}

}  // namespace
}  // namespace mt
