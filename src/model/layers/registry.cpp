#include "src/model/layers/registry.hpp"

#include "src/core/check.hpp"

namespace lockstep {

const LayerType& layer_type(LayerKind kind) {
  static const LayerType* const kTypes[] = {&kEmbeddingLayer, &kAttentionLayer, &kMlpLayer, &kFinalNormLayer,
                                            &kHeadLayer,      &kMoeLayer};
  for (const LayerType* t : kTypes)
    if (t->kind == kind) return *t;
  throw InternalError(str_cat("no layer type for kind ", static_cast<int>(kind)));
}

}  // namespace lockstep
