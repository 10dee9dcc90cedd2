// TorchParams: the parameters as views into flat buffers, dist/'s sharded state over them.
#include "torch/torch_params.h"

#include <torch/torch.h>

#include <algorithm>

#include "dist/zero.h"
#include "runtime/error.h"
#include "torch/comm_hooks.h"

namespace ddp {

namespace {

// The strides of a contiguous tensor of `sizes`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * std::max<int64_t>(sizes[i], 1);
  return strides;
}

int64_t elements(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (const int64_t size : sizes)
    n *= size;
  return n;
}

}  // namespace

TorchParams::TorchParams(std::vector<torch::Tensor> params, std::vector<Slot> slots,
                         std::vector<torch::ScalarType> buffer_dtypes,
                         std::vector<int64_t> buffer_counts, Reducer& ddp,
                         const std::vector<size_t>& param_of, int level,
                         std::function<void(size_t)> moved, std::function<void*()> stream,
                         std::vector<size_t> buffer_units)
    : params_(std::move(params)),
      slots_(std::move(slots)),
      dtypes_(std::move(buffer_dtypes)),
      counts_(std::move(buffer_counts)),
      options_(params_.at(0).options().dtype(torch::kUInt8)),
      owner_(params_.size(), 0),
      bucket_of_(params_.size(), 0),
      piece_at_(params_.size(), -1),
      local_at_(params_.size(), 0),
      local_count_(params_.size(), 0),
      ddp_(ddp),
      level_(level),
      rank_(ddp.comm().rank()),
      moved_(std::move(moved)),
      stream_(std::move(stream)) {
  DDP_CHECK(level >= 1 && level <= 3, "ZeRO level {} (expected 1, 2 or 3)", level);
  DDP_CHECK(param_of.size() == params_.size() && slots_.size() == params_.size(),
            "TorchParams: {} parameters, {} slots, {} layers", params_.size(), slots_.size(),
            param_of.size());
  // Owners: each bucket's layers (the reducer's order) split about evenly by bytes, buckets of
  // one layer taking turns.
  std::vector<size_t> layer_counts, layer_bytes;
  for (const size_t i : param_of) {
    layer_counts.push_back(static_cast<size_t>(elements(slots_[i].sizes)));
    layer_bytes.push_back(layer_counts.back() * params_[i].element_size());
  }
  const std::vector<Bucket>& buckets = ddp.buckets();
  const std::vector<int> layer_owner = balanced_owners(buckets, layer_bytes, ddp.comm().size());
  for (size_t j = 0; j < param_of.size(); ++j)
    owner_[param_of[j]] = layer_owner[j];
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int layer = buckets[b].first_layer; layer <= buckets[b].last_layer; ++layer)
      bucket_of_[param_of[static_cast<size_t>(layer)]] = b;
  // The buckets' memory: LibTorch tensors on the parameters' device, copies in stream order.
  memory_.allocate = [this](size_t bytes) -> std::shared_ptr<void> {
    allocated_.push_back(torch::empty({static_cast<int64_t>(bytes)}, options_));
    const auto held = std::make_shared<torch::Tensor>(allocated_.back());
    return std::shared_ptr<void>(held, held->data_ptr());
  };
  memory_.copy = [this](void* dst, const void* src, size_t bytes) { copy(dst, src, bytes); };
  memory_.clear = [this](void* dst, size_t bytes) {
    if (bytes > 0) bytes_at(dst, bytes).zero_();
  };

  torch::NoGradGuard no_grad;
  make_flats();
  for (size_t i = 0; i < params_.size(); ++i)
    view(i, flats_[slots_[i].buffer], slots_[i].offset).copy_(params_[i]);
  view_flats();
  ShardCut cut;
  for (const torch::ScalarType dtype : dtypes_)
    cut.types.push_back(collective_type(dtype));
  cut.align = options_.device().is_cuda() ? kDeviceShardAlign : 1;  // any piece on the host
  if (level < 3) {
    // Whole tensors to owners. Levels 1 and 2 alike on the wire: the buckets reduce-scattered,
    // the owners' pieces all-gathered after their step (level 1 keeping the all-reduce would
    // send 1.5x plain DDP's bytes, as ZeroRedundancyOptimizer beside DDP does).
    cut.counts = layer_counts;
    cut.owners = layer_owner;
    // The owners' runs of a bucket are laid out in equal pieces in a copy: two copies, taken
    // in turn (a bucket waits for the reduce-scatter two before it), so that the copies hold two
    // buckets' bytes at the peak, not the model's; the averaged pieces apart from them.
    cut.copy_slots = 2;
    cut.pieces_apart = true;
  } else {
    // Equal pieces, kept apart from the gradient buffers, which units free during backward.
    cut.pieces_apart = true;
    buffer_units.resize(dtypes_.size(), 0);
    for (size_t k = 0; k < buffer_units.size(); ++k) {
      if (buffer_units[k] >= unit_buffers_.size()) unit_buffers_.resize(buffer_units[k] + 1);
      unit_buffers_[buffer_units[k]].push_back(k);
    }
  }
  state_ = std::make_unique<ShardedState>(ddp, std::max(level, 2), *this, nullptr, std::move(cut));
  shards_gradients_ = true;
  // Each owned parameter's place in its buffer's pieces: levels 1, 2 in its run, packed after
  // the ones before it; 3 the part of it in this rank's piece of its bucket.
  const ShardPlan& plan = state_->plan();
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardPart& part = plan.parts[bucket_of_[i]];
    const auto offset = static_cast<size_t>(slots_[i].offset);
    if (level == 3) {
      DDP_CHECK(part.strided(), "TorchParams: bucket {} is not in equal pieces", bucket_of_[i]);
      const size_t end = offset + static_cast<size_t>(elements(slots_[i].sizes));
      const size_t from = std::max(offset, part.offset);
      const size_t to = std::min(end, part.offset + part.count);
      local_at_[i] = static_cast<int64_t>(from);
      local_count_[i] = to > from ? static_cast<int64_t>(to - from) : 0;
      piece_at_[i] = static_cast<int64_t>(part.shard_at + (from - part.offset));
      continue;
    }
    if (!owns(i)) continue;
    for (const ShardRun& run : part.runs[static_cast<size_t>(rank_)])
      if (offset >= run.offset && offset < run.offset + run.count)
        piece_at_[i] = static_cast<int64_t>(part.shard_at + run.at + (offset - run.offset));
    DDP_CHECK(piece_at_[i] >= 0 || elements(slots_[i].sizes) == 0,
              "TorchParams: parameter {} is in none of its owner's runs", i);
    piece_at_[i] = std::max<int64_t>(piece_at_[i], 0);
  }
  // Level 3 keeps the parameters whole until the first stale(): the caller hooks their gradient
  // accumulators while they have their shape.
}

TorchParams::~TorchParams() = default;

void TorchParams::keep_all_reduce() {
  ddp_.set_reduction(nullptr);
  shards_gradients_ = false;
}

torch::Tensor TorchParams::own_gradient(size_t i) const {
  DDP_CHECK(shards_gradients_ && owns(i), "own_gradient({}): not this rank's averaged piece", i);
  const torch::ScalarType dtype = dtypes_[slots_[i].buffer];
  if (level_ == 3)  // a piece of its own, kept until the next backward's reduction
    return tensor_at(
        state_->buckets().averaged_at(bucket_of_[i], static_cast<size_t>(local_at_[i])), dtype,
        {local_count_[i]});
  const void* averaged =
      state_->buckets().averaged_at(bucket_of_[i], static_cast<size_t>(slots_[i].offset));
  return torch::from_blob(const_cast<void*>(averaged), slots_[i].sizes, options_.dtype(dtype));
}

torch::Tensor TorchParams::piece_of(size_t i, const torch::Tensor& whole) const {
  return whole.reshape(-1).narrow(0, local_at_[i] - slots_[i].offset, local_count_[i]);
}

torch::Tensor TorchParams::own_piece(size_t i) const {
  const int64_t count = local_count_[i];
  const size_t k = slots_[i].buffer;
  return torch::empty({0}, options_.dtype(dtypes_[k]))
      .set_(pieces_.at(k).storage(), count > 0 ? piece_at_[i] : 0, {count}, {1});
}

void TorchParams::stale() {
  current_ = false;
  if (level_ < 3) return;
  masters_ = false;
  for (size_t i = 0; i < params_.size(); ++i)
    point_at_pieces(i);
  for (size_t u = 0; u < units(); ++u)
    free_unit(u);
}

void TorchParams::set_param_dtype(torch::ScalarType dtype) {
  DDP_CHECK(level_ == 3 && (dtype == torch::kBFloat16 || dtype == torch::kHalf),
            "set_param_dtype: level 3 and bfloat16 or float16");
  cast_flats_.assign(dtypes_.size(), torch::Tensor());
  cast_pieces_.assign(dtypes_.size(), torch::Tensor());
  for (size_t k = 0; k < dtypes_.size(); ++k) {
    if (dtypes_[k] != torch::kFloat32) continue;
    cast_flats_[k] = torch::empty({counts_[k]}, options_.dtype(dtype));
    cast_pieces_[k] =
        torch::empty({static_cast<int64_t>(state_->plan().shard_counts[k])}, options_.dtype(dtype));
  }
}

const torch::Tensor& TorchParams::step_flat(size_t k) const {
  return !masters_ && k < cast_flats_.size() && cast_flats_[k].defined() ? cast_flats_[k]
                                                                         : flats_[k];
}

void TorchParams::gather() {
  if (current_ && level_ < 3) return;
  torch::NoGradGuard no_grad;
  if (level_ < 3) {
    state_->updated();  // every rank's pieces, in place in the flat buffers
  } else {
    if (!masters_) {  // the units gathered in another dtype give way to the masters
      for (size_t u = 0; u < units() && !cast_flats_.empty(); ++u)
        free_unit(u);
      masters_ = true;
    }
    begin_step();
    std::vector<std::unique_ptr<Work>> works;
    for (size_t u = 0; u < units(); ++u)
      gather_unit(u, works);
    wait_all(works, state_->buckets().gather_comm(), stream_());
  }
  current_ = true;
}

void TorchParams::begin_step() {
  current_ = true;
  if (level_ < 3) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& flat = step_flat(slots_[i].buffer);
    repoint(i, flat, slots_[i].offset, slots_[i].sizes, flat.scalar_type());
  }
  if (masters_) return;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < cast_pieces_.size(); ++k)  // this step's gathers send these
    if (cast_pieces_[k].defined())
      cast_pieces_[k].copy_(torch::empty({0}, options_.dtype(dtypes_[k]))
                                .set_(pieces_[k].storage(), 0, {cast_pieces_[k].numel()}, {1}));
}

void TorchParams::gather_unit(size_t u, std::vector<std::unique_ptr<Work>>& works) {
  DDP_CHECK(level_ == 3 && u < units(), "gather_unit({}): level {} has {} units", u, level_,
            units());
  if (unit_gathered(u)) return;
  const std::vector<Bucket>& buckets = ddp_.buckets();
  for (const size_t k : unit_buffers_[u]) {
    const torch::Tensor& flat = step_flat(k);
    c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
    const size_t bytes = static_cast<size_t>(counts_[k]) * flat.element_size();
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    storage->set_nbytes(bytes);
    const bool cast = !flat.is_same(flats_[k]);
    for (size_t b = 0; b < buckets.size(); ++b)
      if (buckets[b].buffer == k)
        works.push_back(cast ? state_->gather_bucket(b, flat.data_ptr(), cast_pieces_[k].data_ptr(),
                                                     collective_type(flat.scalar_type()))
                             : state_->gather_bucket(b, flat.data_ptr()));
  }
}

void TorchParams::free_unit(size_t u) {
  for (const size_t k : unit_buffers_.at(u))
    for (const torch::Tensor* flat :
         {&flats_[k], k < cast_flats_.size() ? &cast_flats_[k] : nullptr}) {
      if (flat == nullptr || !flat->defined()) continue;
      c10::StorageImpl* storage = flat->storage().unsafeGetStorageImpl();
      storage->set_data_ptr_noswap(at::DataPtr(nullptr, flat->device()));
      storage->set_nbytes(0);
    }
}

bool TorchParams::unit_gathered(size_t u) const {
  return step_flat(unit_buffers_.at(u).at(0)).storage().nbytes() > 0;
}

size_t TorchParams::held_bytes() const {
  size_t bytes = 0;
  for (const std::vector<torch::Tensor>* tensors : {&flats_, &pieces_, &cast_flats_, &cast_pieces_})
    for (const torch::Tensor& t : *tensors)
      if (t.defined()) bytes += t.storage().nbytes();
  return bytes;
}

void TorchParams::take_back(size_t i) {
  torch::NoGradGuard no_grad;
  const torch::Tensor loaded = params_[i].detach();
  const Slot& slot = slots_[i];
  if (level_ == 3) {  // its piece, and its place in its unit where gathered
    if (local_count_[i] > 0)
      torch::empty({0}, params_[i].options())
          .set_(pieces_[slot.buffer].storage(), piece_at_[i], {local_count_[i]}, {1})
          .copy_(loaded.reshape(-1).narrow(0, local_at_[i] - slot.offset, local_count_[i]));
    for (const torch::Tensor* flat :
         {&flats_[slot.buffer],
          slot.buffer < cast_flats_.size() ? &cast_flats_[slot.buffer] : nullptr})
      if (flat != nullptr && flat->defined() && flat->storage().nbytes() > 0)
        torch::empty({0}, flat->options())
            .set_(flat->storage(), slot.offset, slot.sizes, contiguous_strides(slot.sizes))
            .copy_(loaded);
    const torch::Tensor& flat = step_flat(slot.buffer);
    if (current_)
      repoint(i, flat, slot.offset, slot.sizes, flat.scalar_type());
    else
      point_at_pieces(i);
    return;
  }
  torch::Tensor into;
  if (!flats_.empty() && flats_[slot.buffer].defined()) {
    torch::Tensor whole = view(i, flats_[slot.buffer], slot.offset);
    whole.copy_(loaded);
    into = whole;
  }
  point(i, into.defined() ? into : torch::empty({0}, params_[i].options()));
  current_ = false;  // the owner's loaded values reach everyone at the next gather
}

std::vector<GradMemory> TorchParams::param_memory() {
  std::vector<GradMemory> memory;
  for (size_t k = 0; k < dtypes_.size(); ++k)
    memory.push_back(
        {flats_.at(k).defined() ? flats_[k].data_ptr() : nullptr, collective_type(dtypes_[k])});
  return memory;
}

std::shared_ptr<void> TorchParams::allocate(size_t bytes, bool pieces) {
  const auto size = static_cast<int64_t>(bytes);
  const auto held = std::make_shared<torch::Tensor>(pieces ? torch::zeros({size}, options_)
                                                           : torch::empty({size}, options_));
  if (pieces) pieces_.push_back(*held);
  allocated_.push_back(*held);
  return std::shared_ptr<void>(held, held->data_ptr());
}

torch::Tensor TorchParams::bytes_at(void* data, size_t bytes) const {
  return torch::from_blob(data, {static_cast<int64_t>(bytes)}, options_);
}

void TorchParams::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) bytes_at(dst, bytes).copy_(bytes_at(const_cast<void*>(src), bytes));
}

std::vector<float> TorchParams::to_host(const float* src, size_t floats) {
  const torch::Tensor host =
      torch::from_blob(const_cast<float*>(src), {static_cast<int64_t>(floats)},
                       options_.dtype(torch::kFloat32))
          .cpu();
  return std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + floats);
}

void TorchParams::from_host(float* dst, const float* host, size_t floats) {
  torch::from_blob(dst, {static_cast<int64_t>(floats)}, options_.dtype(torch::kFloat32))
      .copy_(torch::from_blob(const_cast<float*>(host), {static_cast<int64_t>(floats)}));
}

std::vector<float> TorchParams::whole_params() {
  DDP_CHECK(dtypes_.size() == 1 && dtypes_[0] == torch::kFloat32 && flats_.at(0).defined(),
            "TorchParams: whole parameters out as float32 need one float32 buffer");
  return to_host(flats_[0].data_ptr<float>(), static_cast<size_t>(counts_[0]));
}

void TorchParams::set_whole_params(const float* host) {
  DDP_CHECK(dtypes_.size() == 1 && dtypes_[0] == torch::kFloat32 && flats_.at(0).defined(),
            "TorchParams: whole parameters in as float32 need one float32 buffer");
  from_host(flats_[0].data_ptr<float>(), host, static_cast<size_t>(counts_[0]));
}

torch::Tensor TorchParams::view(size_t i, const torch::Tensor& storage, int64_t offset) const {
  return torch::empty({0}, params_[i].options())
      .set_(storage.storage(), offset, slots_[i].sizes, contiguous_strides(slots_[i].sizes));
}

void TorchParams::make_flats() {
  flats_.clear();
  for (size_t k = 0; k < dtypes_.size(); ++k)  // zeros: a padded bucket's tail is never written
    flats_.push_back(torch::zeros({counts_[k]}, options_.dtype(dtypes_[k])));
}

void TorchParams::view_flats() {
  for (size_t i = 0; i < params_.size(); ++i)
    point(i, view(i, flats_[slots_[i].buffer], slots_[i].offset));
}

void TorchParams::repoint(size_t i, const torch::Tensor& storage, int64_t offset,
                          const std::vector<int64_t>& sizes, torch::ScalarType dtype) {
  c10::TensorImpl* impl = params_[i].unsafeGetTensorImpl();
  impl->set_storage_and_dtype(storage.storage(), c10::scalarTypeToTypeMeta(dtype));
  impl->set_storage_offset(offset);
  impl->set_sizes_and_strides(sizes, contiguous_strides(sizes));
}

void TorchParams::point_at_pieces(size_t i) {
  const int64_t count = local_count_[i];
  repoint(i, pieces_[slots_[i].buffer], count > 0 ? piece_at_[i] : 0, {count},
          dtypes_[slots_[i].buffer]);
}

torch::Tensor TorchParams::tensor_at(const void* data, torch::ScalarType dtype,
                                     const std::vector<int64_t>& sizes) const {
  const auto* at = static_cast<const char*>(data);
  for (const torch::Tensor& held : allocated_) {
    const auto* base = static_cast<const char*>(held.data_ptr());
    if (at < base || at >= base + held.numel()) continue;
    const auto element = static_cast<int64_t>(c10::elementSize(dtype));
    return torch::empty({0}, options_.dtype(dtype))
        .set_(held.storage(), (at - base) / element, sizes, contiguous_strides(sizes));
  }
  DDP_CHECK(false, "TorchParams: no memory of its own holds that piece");
  return {};
}

void TorchParams::point(size_t i, const torch::Tensor& to) {
  params_[i].set_(to);
  moved_(i);
}

}  // namespace ddp
