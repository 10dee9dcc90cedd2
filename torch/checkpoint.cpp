// ddp::checkpoint: a custom autograd function whose forward runs the block without grad mode
// (nothing saved but its inputs) and whose backward runs it again with grad mode and takes the
// gradients of its inputs and parameters from that graph (torch::autograd::grad, which
// accumulates nothing), returning them to the program's own backward. The parameters are the
// function's inputs too, so that their gradient accumulators (and the hooks on them) run once,
// in the outer backward.
#include "torch/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <mutex>
#include <unordered_set>
#include <utility>

#include "runtime/error.h"
#include "torch/autocast.h"
#include "torch/shard_unit.h"

namespace ddp {

namespace detail {

namespace {
thread_local int recomputes = 0;
}

bool recomputing() {
  return recomputes > 0;
}

}  // namespace detail

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d)
    s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// The random number generators a recompute must find as the forward left them: the CPU's and
// the default one of each CUDA device among the inputs (torch.utils.checkpoint's choice).
class RngStates {
 public:
  RngStates() = default;
  explicit RngStates(const variable_list& inputs) {
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    for (const torch::Tensor& x : inputs)
      if (x.defined() && x.is_cuda() &&
          std::find(devices.begin(), devices.end(), x.device()) == devices.end())
        devices.push_back(x.device());
    for (const c10::Device& device : devices) {
      const at::Generator& generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(generator).mutex());
      states_.emplace_back(device, generator.get_state());
    }
  }
  // Sets each generator to its saved state; returns their states before.
  RngStates swap_in() const {
    RngStates before;
    for (const auto& [device, state] : states_) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      before.states_.emplace_back(device, generator.get_state());
      generator.set_state(state);
    }
    return before;
  }

 private:
  std::vector<std::pair<c10::Device, torch::Tensor>> states_;
};

// What a checkpoint's backward needs besides its saved inputs.
struct Recompute : torch::CustomClassHolder {
  CheckpointedFunction fn;
  size_t inputs = 0;  // the first `inputs` of the node's edges are the inputs, then parameters
  std::vector<bool> input_needs_grad;
  std::vector<torch::Tensor> parameters;
  RngStates rng;
  bool preserve_rng = true;
  AutocastState autocast;
};

// Every leaf needing a gradient that the recomputed graph reaches is one of `known`, and (on a
// thread whose nodes are numbered in one sequence, the CPU's backward) every node is the
// recompute's own: a tensor with a gradient read from outside would get none.
void check_reaches_only(const variable_list& outputs,
                        const std::unordered_set<const c10::TensorImpl*>& known,
                        uint64_t first_node) {
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const torch::Tensor& out : outputs)
    if (out.defined() && out.grad_fn()) todo.push_back(out.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      DDP_USAGE_CHECK(known.count(leaf->variable.unsafeGetTensorImpl()) > 0,
                      "ddp::checkpoint: the function reads a tensor of shape {} that needs a "
                      "gradient and is neither among its inputs nor its parameters; its gradient "
                      "would be lost: pass it in the parameters (or the inputs)",
                      shape_of(leaf->variable));
      continue;
    }
    DDP_USAGE_CHECK(node->sequence_nr() >= first_node,
                    "ddp::checkpoint: the function reads a tensor computed outside it that needs "
                    "a gradient ({}'s output) without taking it as an input; its gradient would "
                    "be lost: pass it in the inputs",
                    node->name());
    for (const torch::autograd::Edge& edge : node->next_edges())
      if (edge.function) todo.push_back(edge.function.get());
  }
}

// Autocast's cache of casts off while it lives: a cast made in the forward without grad mode
// would be found again by a later use of the same weight with grad mode (in the recompute, or
// outside the checkpoint in the same autocast region) and give it no gradient; one made in the
// recompute (inside a backward) would outlive its graph.
class NoAutocastCache {
 public:
  NoAutocastCache() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool was_;
};

struct CheckpointNode : torch::autograd::Function<CheckpointNode> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> recompute,
                               at::TensorList inputs, at::TensorList /*parameters*/) {
    // Grad mode is off here (LibTorch runs a custom function's forward so): nothing inside
    // is saved for backward.
    ctx->save_for_backward(variable_list(inputs.begin(), inputs.end()));
    const NoAutocastCache no_cache;
    variable_list outputs = recompute->fn(variable_list(inputs.begin(), inputs.end()));
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(recompute));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t n = recompute->inputs;
    // Which gradients this backward asks for (a pipeline's split backward asks for the inputs'
    // and the parameters' in two passes).
    std::vector<bool> wanted(n + recompute->parameters.size());
    bool any = false;
    for (size_t i = 0; i < wanted.size(); ++i)
      any |= wanted[i] = ctx->needs_input_grad(i);
    variable_list result(1 + wanted.size());  // the Recompute argument's slot first
    if (!any) return result;

    variable_list inputs;
    std::unordered_set<const c10::TensorImpl*> known;
    for (size_t i = 0; i < n; ++i) {
      torch::Tensor x = saved[i].defined() ? saved[i].detach() : saved[i];
      if (x.defined()) x.requires_grad_(recompute->input_needs_grad[i]);
      if (x.defined()) known.insert(x.unsafeGetTensorImpl());
      inputs.push_back(std::move(x));
    }
    for (const torch::Tensor& p : recompute->parameters)
      known.insert(p.unsafeGetTensorImpl());

    variable_list outputs;
    const uint64_t first_node = at::sequence_number::peek();
    {
      RngStates current;
      if (recompute->preserve_rng) current = recompute->rng.swap_in();
      const AutocastState was = AutocastState::now();
      recompute->autocast.apply();
      ++detail::recomputes;
      try {
        const NoAutocastCache no_cache;
        torch::AutoGradMode grad_mode(true);
        outputs = recompute->fn(inputs);
      } catch (...) {
        --detail::recomputes;
        was.apply();
        if (recompute->preserve_rng) current.swap_in();
        throw;
      }
      --detail::recomputes;
      was.apply();
      if (recompute->preserve_rng) current.swap_in();
    }
    DDP_CHECK(outputs.size() == grad_outputs.size(),
              "ddp::checkpoint: the function gave {} outputs in the recompute, {} in the forward",
              outputs.size(), grad_outputs.size());
    check_reaches_only(outputs, known, first_node);

    variable_list roots, root_grads, wrt;
    std::vector<size_t> wrt_index;
    for (size_t k = 0; k < outputs.size(); ++k)
      if (outputs[k].defined() && outputs[k].requires_grad() && grad_outputs[k].defined()) {
        roots.push_back(outputs[k]);
        root_grads.push_back(grad_outputs[k]);
      }
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (!wanted[i]) continue;
      const torch::Tensor& x = i < n ? inputs[i] : recompute->parameters[i - n];
      if (!x.defined() || !x.requires_grad()) continue;
      wrt.push_back(x);
      wrt_index.push_back(i);
    }
    if (roots.empty() || wrt.empty()) return result;
    const variable_list grads = torch::autograd::grad(roots, wrt, root_grads,
                                                      /*retain_graph=*/false,
                                                      /*create_graph=*/false,
                                                      /*allow_unused=*/true);
    for (size_t k = 0; k < grads.size(); ++k)
      result[1 + wrt_index[k]] = grads[k];
    return result;
  }
};

}  // namespace

torch::autograd::variable_list checkpoint(CheckpointedFunction fn,
                                          const torch::autograd::variable_list& inputs,
                                          const std::vector<torch::Tensor>& parameters,
                                          const CheckpointOptions& options) {
  DDP_USAGE_CHECK(static_cast<bool>(fn), "ddp::checkpoint: the function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    DDP_USAGE_CHECK(inputs[i].defined(), "ddp::checkpoint: input {} is an undefined tensor", i);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->fn = std::move(fn);
  recompute->inputs = inputs.size();
  for (const torch::Tensor& x : inputs)
    recompute->input_needs_grad.push_back(x.requires_grad());
  std::vector<torch::Tensor> trained;  // those without a gradient need no edge
  for (const torch::Tensor& p : parameters)
    if (p.defined() && p.requires_grad()) trained.push_back(p);
  recompute->parameters = trained;
  recompute->preserve_rng = options.preserve_rng_state();
  if (recompute->preserve_rng) recompute->rng = RngStates(inputs);
  recompute->autocast = AutocastState::now();
  if (!torch::GradMode::is_enabled()) return recompute->fn(inputs);  // nothing to recompute for
  return CheckpointNode::apply(std::move(recompute), at::TensorList(inputs),
                               at::TensorList(trained));
}

torch::Tensor CheckpointWrapperImpl::forward(torch::Tensor input) {
  return checkpoint(
      [this](const torch::autograd::variable_list& in) {
        return torch::autograd::variable_list{forward_wrapped(in[0])};
      },
      {std::move(input)}, parameters(), options_)[0];
}

void CheckpointWrapperImpl::refuse_a_unit() const {
  DDP_USAGE_CHECK(dynamic_cast<const ShardUnitImpl*>(module().get()) == nullptr,
                  "ddp::CheckpointWrapper around a ddp::ShardUnit: the unit would not be found "
                  "by the wrapper's ZeRO; wrap the other way round, "
                  "ddp::ShardUnit(ddp::CheckpointWrapper(block))");
}

}  // namespace ddp
