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
