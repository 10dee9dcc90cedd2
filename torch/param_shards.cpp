// ParamShards: owners, flat tensors, the owners' broadcast and ZeRO 3's frees.
#include "torch/param_shards.h"

#include <torch/torch.h>

#include <set>

#include "runtime/error.h"

namespace ddp {

namespace {

// The strides of a contiguous tensor of `sizes`.
std::vector<int64_t> contiguous_strides(torch::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * std::max<int64_t>(sizes[i], 1);
  return strides;
}

}  // namespace

ParamShards::ParamShards(std::vector<torch::Tensor> params, int level, int rank, int ranks,
                         std::function<void(size_t)> moved)
    : params_(std::move(params)),
      owner_(params_.size()),
      offset_(params_.size()),
      owner_count_(static_cast<size_t>(ranks), 0),
      flat_(static_cast<size_t>(ranks)),
      level_(level),
      rank_(rank),
      moved_(std::move(moved)) {
  DDP_CHECK(level >= 1 && level <= 3, "ZeRO level {} (expected 1, 2 or 3)", level);
  int64_t total = 0;
  for (const torch::Tensor& p : params_) {
    total += p.numel() * static_cast<int64_t>(p.element_size());
    sizes_.emplace_back(p.sizes().begin(), p.sizes().end());
  }
  // Contiguous runs balanced by bytes: a parameter goes to the rank whose equal share holds
  // its middle element. In its owner's flat bytes it starts at a multiple of its element size.
  int64_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t size = static_cast<int64_t>(params_[i].element_size());
    const int64_t middle = at + params_[i].numel() / 2 * size;
    const int o = static_cast<int>(
        std::min<int64_t>(ranks - 1, middle * ranks / std::max<int64_t>(total, 1)));
    owner_[i] = std::max(o, i > 0 ? owner_[i - 1] : 0);
    int64_t& count = owner_count_[static_cast<size_t>(owner_[i])];
    count = (count + size - 1) / size * size;
    offset_[i] = count;
    count += params_[i].numel() * size;
    at += params_[i].numel() * size;
  }
  for (int64_t& count : owner_count_)  // whole 32-bit words (the broadcast's)
    count = (count + 3) / 4 * 4;
  torch::NoGradGuard no_grad;
  for (int o = 0; o < ranks; ++o) {
    if (level_ == 3 && o != rank_) {
      free(o);
      continue;
    }
    flat_[static_cast<size_t>(o)] = make_flat(o);
    for (size_t i = 0; i < params_.size(); ++i)
      if (owner_[i] == o) slot(i).copy_(params_[i]);
    view_into(o);
  }
  current_ = level_ < 3 || ranks == 1;  // ZeRO 3: the others' parameters come at gather
}

torch::Tensor ParamShards::make_flat(int owner) const {
  return torch::empty({owner_count_[static_cast<size_t>(owner)]},
                      params_[0].options().dtype(torch::kUInt8));
}

torch::Tensor ParamShards::slot(size_t i) const {
  const torch::Tensor& flat = flat_[static_cast<size_t>(owner_[i])];
  const int64_t size = static_cast<int64_t>(params_[i].element_size());
  return torch::empty({0}, params_[i].options())
      .set_(flat.storage(), offset_[i] / size, sizes_[i], contiguous_strides(sizes_[i]));
}

void ParamShards::view_into(int owner) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != owner) continue;
    const int64_t size = static_cast<int64_t>(params_[i].element_size());
    params_[i].set_(flat_[static_cast<size_t>(owner)].storage(), offset_[i] / size, sizes_[i],
                    contiguous_strides(sizes_[i]));
    moved_(i);
  }
}

void ParamShards::free(int owner) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != owner) continue;
    params_[i].set_(torch::empty({0}, params_[i].options()));
    moved_(i);
  }
  flat_[static_cast<size_t>(owner)] = torch::Tensor();
}

void ParamShards::stale() {
  current_ = false;
  if (level_ < 3) return;
  torch::NoGradGuard no_grad;
  for (size_t o = 0; o < flat_.size(); ++o)
    if (static_cast<int>(o) != rank_ && flat_[o].defined()) free(static_cast<int>(o));
}

void ParamShards::gather(Communicator& comm, void* stream) {
  if (current_) return;
  torch::NoGradGuard no_grad;
  for (size_t o = 0; o < flat_.size(); ++o) {
    const int owner = static_cast<int>(o);
    if (!flat_[o].defined()) {  // ZeRO 3: freed since the last gather
      flat_[o] = make_flat(owner);
      view_into(owner);
    }
    if (owner_count_[o] == 0) continue;
    // The bytes as 32-bit words: a copy, whatever the parameters' dtypes.
    const size_t words = static_cast<size_t>(owner_count_[o] / 4);
    if (comm.device_buffers())
      comm.broadcast_async(flat_[o].data_ptr(), words, DataType::kInt32, owner)->then_on(stream);
    else
      comm.broadcast(flat_[o].data_ptr(), words, DataType::kInt32, owner);
  }
  current_ = true;
}

void ParamShards::take_back(size_t i) {
  torch::NoGradGuard no_grad;
  torch::Tensor& p = params_[i];
  if (flat_[static_cast<size_t>(owner_[i])].defined()) {
    torch::Tensor view = slot(i);
    view.copy_(p);
    p.set_(view);
  } else {
    p.set_(torch::empty({0}, p.options()));
  }
  current_ = false;  // the owner's loaded values reach everyone at the next gather
  moved_(i);
}

size_t ParamShards::parameter_bytes() const {
  size_t bytes = 0;
  for (const torch::Tensor& flat : flat_)
    if (flat.defined()) bytes += static_cast<size_t>(flat.numel());
  return bytes;
}

}  // namespace ddp
