// The layer kinds: for each, the function that declares a layer of that kind (its params, hooks
// and ops, from its dims) and the one that builds it. A new kind is one file in this folder that
// defines its LayerType, and one line in registry.cpp.
#pragma once

#include <memory>

#include "src/model/layer.hpp"
#include "src/model/layer_list.hpp"

namespace lockstep {

struct LayerType {
  LayerKind kind;
  const char* name;  // in messages, e.g. "attention"
  // Fills desc.params, desc.hooks and desc.ops (desc.input, dims and options are set).
  void (*declare)(LayerDesc& desc);
  std::unique_ptr<Layer> (*build)(const LayerDesc& desc, const LayerBuild& b);
};

const LayerType& layer_type(LayerKind kind);

// The kinds, each defined in its own file.
extern const LayerType kEmbeddingLayer;  // embedding.cpp
extern const LayerType kAttentionLayer;  // attention.cpp
extern const LayerType kMlpLayer;        // mlp.cpp
extern const LayerType kFinalNormLayer;  // final_norm.cpp
extern const LayerType kHeadLayer;       // head.cpp
extern const LayerType kMoeLayer;        // moe.cpp

}  // namespace lockstep
