// MUNGE, Slurm's credential service, for the store under srun: a client proves which user it
// runs as with a credential from its node's munged; the store's rank 0 has it decoded by its
// own munged (the same key across the cluster) and admits only the job's user. The library
// is opened with dlopen (libmunge.so.2): built where munge.h was found (libmunge-dev), used
// where the library and a munged are there. `socket`: munged's socket where it is not
// libmunge's default ("": the default; ProcessEnv::munge_socket, DDP_MUNGE_SOCKET).
#pragma once

#include <optional>
#include <string>

namespace ddp {

// Whether this build can use MUNGE at all (munge.h at configure time).
bool munge_built();

// A credential carrying `payload`, from this node's munged; nullopt with *why_not set when
// MUNGE is not built, its library not installed, or munged does not answer.
std::optional<std::string> munge_credential(const std::string& payload, const std::string& socket,
                                            std::string* why_not);

// Who made a credential, as munged decodes it.
struct MungeIdentity {
  unsigned uid = 0;
  unsigned gid = 0;
  std::string payload;
};
// Decodes `credential` (refused: expired, replayed, of another key, garbage); nullopt with
// *why_not set then, or when MUNGE is not usable here.
std::optional<MungeIdentity> munge_decode_credential(const std::string& credential,
                                                     const std::string& socket,
                                                     std::string* why_not);

}  // namespace ddp
