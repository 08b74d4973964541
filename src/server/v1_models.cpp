// v1_models.cpp: GET /v1/models and GET /v1/models/{id} (spec §6): the one model served.
#include "server/errors.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

namespace {
json model_card(const ServerContext& ctx) {
  // id, object "model", created (unix seconds), owned_by; plus max_model_len as vLLM advertises.
  return json{{"id", ctx.options.model_name},
              {"object", "model"},
              {"created", int64_t(ctx.started)},
              {"owned_by", "lily"},
              {"max_model_len", ctx.service().context_size()}};
}
}  // namespace

void handle_models(ServerContext& ctx, const HttpRequest&, HttpResponse& res) {
  res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_card(ctx)})}}), "application/json");
}

void handle_model(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const std::string id = req.path_params.empty() ? std::string() : req.path_params[0];
  if (id != ctx.options.model_name) {
    throw ApiError(404, "the model '" + id + "' does not exist (this server serves '" + ctx.options.model_name + "')",
                   "model", "model_not_found");
  }
  res.set_content(dump(model_card(ctx)), "application/json");
}

}  // namespace lily::server
