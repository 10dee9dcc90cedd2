// A batch's loss as a sum and its hits: what a model's last stage hands the training loop,
// whatever the model (the MLP's softmax cross-entropy, a LibTorch module's loss), so that the
// pipeline's stages (engine/pipeline/stage.h) and the models need not include each other.
#pragma once

namespace ddp {

// A batch's loss, summed, and its hits.
struct LossSum {
  double loss = 0;  // sum over the batch of the per-sample loss (-log softmax[label] for the MLP)
  int correct = 0;  // samples whose arg-max equals the label (where the model counts them)
};

}  // namespace ddp
