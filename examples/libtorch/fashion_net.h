// The example's network, the shape of pytorch/examples' cpp/mnist: two convolutions with max
// pooling, dropout, and two linear layers, on 28x28 grey images of 10 classes.
#pragma once

#include <torch/torch.h>

struct FashionNetImpl : torch::nn::Module {
  FashionNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)))),
        dropout(register_module("dropout", torch::nn::Dropout2d())),
        fc1(register_module("fc1", torch::nn::Linear(320, 50))),
        fc2(register_module("fc2", torch::nn::Linear(50, 10))) {}

  // Log-probabilities of the 10 classes for images [batch, 1, 28, 28].
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(dropout->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2->forward(x), 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d dropout;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(FashionNet);
