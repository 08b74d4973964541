// config.json validation: every unsupported or missing field is an error naming it.
#include <gtest/gtest.h>

#include "base/error.h"
#include "fixture.h"
#include "model/config.h"

namespace lily {
namespace {

nlohmann::json base_config() { return test::read_json(test::fixture_dir("tiny-a") + "/hf-fused/config.json"); }

std::string error_of(const nlohmann::json& j) {
  try {
    parse_model_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ParsesTheFixture) {
  ModelConfig c = parse_model_config(base_config());
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e7f);
  EXPECT_EQ(c.layer_types[3], LayerKind::full_attention);
  EXPECT_EQ(c.layer_types[0], LayerKind::linear_attention);
  EXPECT_EQ(c.linear_conv_dim(), 2 * 2 * 128 + 4 * 128);
}

TEST(Config, FlatTextOnlyConfigParses) {
  auto j = base_config()["text_config"];
  j["model_type"] = "qwen3_5_moe_text";
  EXPECT_EQ(parse_model_config(j).num_layers, 4);
}

TEST(Config, RejectsWhatLilyCannotRun) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  } cases[] = {
      {[](auto& j) { j["model_type"] = "llama"; }, "model_type"},
      {[](auto& j) { j["text_config"].erase("hidden_size"); }, "'hidden_size'"},
      {[](auto& j) { j["text_config"]["hidden_size"] = "128"; }, "'hidden_size' must be an integer"},
      {[](auto& j) { j["text_config"]["head_dim"] = 128; }, "head_dim"},
      {[](auto& j) { j["text_config"]["rope_parameters"]["rope_type"] = "yarn"; }, "rope_type"},
      {[](auto& j) {
         j["text_config"]["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
       },
       "rope"},
      {[](auto& j) { j["text_config"]["layer_types"][0] = "sliding_attention"; }, "sliding_attention"},
      {[](auto& j) { j["text_config"]["num_hidden_layers"] = 8; }, "layer_types"},
      {[](auto& j) { j["text_config"]["linear_key_head_dim"] = 64; }, "linear_key_head_dim"},
      {[](auto& j) { j["text_config"]["num_experts_per_tok"] = 99; }, "num_experts_per_tok"},
      {[](auto& j) { j["text_config"]["hidden_act"] = "gelu"; }, "hidden_act"},
      {[](auto& j) {
         j["quantization"] = {{"group_size", 64}, {"bits", 3}};
       },
       "bits = 3"},
      {[](auto& j) {
         j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "mxfp4"}};
       },
       "mode"},
  };
  for (auto& c : cases) {
    auto j = base_config();
    c.edit(j);
    std::string err = error_of(j);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: '" << err << "'";
  }
}

// Issue 17: quantized HF checkpoints were refused with messages that never named the format
// ("missing field 'group_size'"). Each is refused by name, before any other field is read.
TEST(Config, regression_foreign_quantization_is_named_17) {
  const std::string use = "checkpoints are not supported: use the bf16 or mlx 4-bit checkpoint";
  struct Case {
    nlohmann::json quantization_config;
    std::string expect;
  } cases[] = {
      {{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}, "FP8 (quant_method fp8) " + use},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemm"}},
       "AWQ (quant_method awq) " + use},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", false}},
       "GPTQ (quant_method gptq) " + use},
      {{{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}},
       "FP8 (quant_method compressed-tensors, format float-quantized) " + use},
      {{{"quant_method", "compressed-tensors"},
        {"config_groups", {{"group_0", {{"format", "nvfp4-pack-quantized"}, {"targets", {"Linear"}}}}}}},
       "NVFP4 (quant_method compressed-tensors, format nvfp4-pack-quantized) " + use},
      {{{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}},
       "compressed-tensors (quant_method compressed-tensors, format pack-quantized) " + use},
      {{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}},
       "NVFP4 (quant_method modelopt, quant_algo NVFP4) " + use},
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, "bitsandbytes (quant_method bitsandbytes) " + use},
  };
  for (const auto& c : cases) {
    auto j = base_config();
    j["quantization_config"] = c.quantization_config;
    EXPECT_EQ(error_of(j), c.expect);
    // Some exports put it in text_config instead.
    auto nested = base_config();
    nested["text_config"]["quantization_config"] = c.quantization_config;
    EXPECT_EQ(error_of(nested), c.expect);
  }
  auto not_a_string = base_config();
  not_a_string["quantization_config"] = {{"quant_method", 4}};
  EXPECT_EQ(error_of(not_a_string), "config.json: quantization_config.quant_method must be a string, found 4");
  // mlx's own entry says quant_method "mlx" in some exports, or nothing: it is read as before.
  auto mlx = base_config();
  mlx["quantization"] = {{"group_size", 64}, {"bits", 4}, {"quant_method", "mlx"}};
  EXPECT_EQ(error_of(mlx), "");
}

// Issue 17: a vision_tower.* override lily never uses (mlx-vlm quantizes the vision tower its own
// way) rejected the whole model. Overrides of modules lily does not load are ignored.
TEST(Config, regression_vision_tower_override_is_ignored_17) {
  auto j = base_config();
  j["quantization"] = {{"group_size", 64},
                       {"bits", 4},
                       {"vision_tower.blocks.0.attn.qkv", {{"group_size", 32}, {"bits", 6}}},
                       {"model.visual.merger", {{"group_size", 16}, {"bits", 5}, {"mode", "mxfp4"}}},
                       {"language_model.model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}}};
  const ModelConfig c = parse_model_config(j);
  ASSERT_TRUE(c.quantization);
  EXPECT_EQ(c.quantization->overrides.size(), 1u);
  EXPECT_EQ(c.quantization->for_module("language_model.model.layers.0.mlp.gate")->bits, 8);
  // A module of the text model with an unsupported scheme is still refused, naming it.
  j["quantization"]["language_model.model.layers.1.mlp.gate"] = {{"group_size", 64}, {"bits", 6}};
  EXPECT_NE(error_of(j).find("language_model.model.layers.1.mlp.gate' bits = 6"), std::string::npos) << error_of(j);
  // A prefix must end at a '.': "vision_towers" is not the vision tower.
  j["quantization"].erase("language_model.model.layers.1.mlp.gate");
  j["quantization"]["vision_towers.x"] = {{"group_size", 64}, {"bits", 6}};
  EXPECT_NE(error_of(j).find("vision_towers.x"), std::string::npos) << error_of(j);
}

// Numbers a hostile or broken config.json may hold: out of range, not UB or a wrapped int.
TEST(Config, NumbersOutOfRangeAreNamed) {
  auto big = base_config();
  big["text_config"]["hidden_size"] = 1ull << 40;
  EXPECT_NE(error_of(big).find("'hidden_size' = 1099511627776 is out of range"), std::string::npos) << error_of(big);
  auto huge = base_config();
  huge["text_config"]["num_experts"] = 18446744073709551615ull;
  EXPECT_NE(error_of(huge).find("'num_experts' = 18446744073709551615 is out of range"), std::string::npos)
      << error_of(huge);
  auto eps = base_config();
  eps["text_config"]["rms_norm_eps"] = 1e300;
  EXPECT_NE(error_of(eps).find("rms_norm_eps"), std::string::npos);
  EXPECT_THROW(parse_generation_config(nlohmann::json::parse(R"({"eos_token_id": [1, -2]})")), Error);
  EXPECT_THROW(parse_generation_config(nlohmann::json::parse(R"({"eos_token_id": 4294967296})")), Error);
  EXPECT_THROW(parse_generation_config(nlohmann::json::parse(R"({"temperature": 1e300})")), Error);
  EXPECT_THROW(parse_generation_config(nlohmann::json::parse(R"({"top_k": 1e300})")), Error);
}

TEST(Config, GenerationConfig) {
  GenerationConfig g = parse_generation_config(
      nlohmann::json::parse(R"({"eos_token_id":[5,6],"top_k":20,"temperature":0.7})"));
  EXPECT_EQ(g.eos_token_ids, (std::vector<int>{5, 6}));
  EXPECT_EQ(*g.top_k, 20);
  EXPECT_FLOAT_EQ(*g.temperature, 0.7f);
  EXPECT_THROW(parse_generation_config(nlohmann::json::parse(R"({"eos_token_id":"x"})")), Error);
}

}  // namespace
}  // namespace lily
