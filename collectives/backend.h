// Which collectives backend a communicator uses: --backend's words and the enum every layer
// passes (auto: NCCL with GPU buffers, else Gloo under ddprun, else MPI under mpirun; one
// process gets a communicator of its own whatever auto would pick).
#pragma once

#include <optional>
#include <string>

namespace ddp {

// A collectives backend (kAuto: chosen as above).
enum class Backend { kAuto, kNccl, kGloo, kMpi };

// "auto", "nccl", "gloo", "mpi": --backend's words.
inline const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kNccl:
      return "nccl";
    case Backend::kGloo:
      return "gloo";
    case Backend::kMpi:
      return "mpi";
  }
  return "?";
}

// The backend `name` means ("auto", "nccl", "gloo", "mpi"); nullopt for any other.
inline std::optional<Backend> backend_from_name(const std::string& name) {
  for (Backend b : {Backend::kAuto, Backend::kNccl, Backend::kGloo, Backend::kMpi})
    if (name == backend_name(b)) return b;
  return std::nullopt;
}

}  // namespace ddp
