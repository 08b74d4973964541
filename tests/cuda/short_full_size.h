// short_full_size.h: the model's widths with few layers, for tests that need Qwen3.6's shapes
// without its 40 layers (task lists, the persistent kernel's refusals and steps).
#pragma once

#include <cstddef>

#include "model/config.h"

namespace lily::test {

// `layers` layers of the full size's widths, the last one attention, the others as the model's.
inline ModelConfig short_full_size(int layers) {
  ModelConfig c = qwen36_35b_a3b_config();
  c.layer_types.resize(size_t(layers));
  c.num_layers = layers;
  c.layer_types.back() = LayerKind::full_attention;
  return c;
}

}  // namespace lily::test
