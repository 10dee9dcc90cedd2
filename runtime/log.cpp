// Installs one spdlog logger with a console sink and an optional per-rank file sink.
#include "runtime/log.h"
#include "runtime/log_line.h"

#include <memory>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace ddp {

void init_logging(const LogConfig& config) {
  auto console = std::make_shared<spdlog::sinks::stdout_sink_mt>();
  const bool loud = config.rank == 0 || config.all_ranks;
  console->set_level(config.verbose ? spdlog::level::debug
                                    : (loud ? spdlog::level::info : spdlog::level::warn));
  std::vector<spdlog::sink_ptr> sinks{console};
  if (!config.file.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(config.file, true);
    file->set_level(spdlog::level::debug);
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("ddp", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::debug);
  const std::string who = config.show_rank
                              ? fmt::format("{}/{} {}", config.rank, config.world, config.device)
                              : config.device;
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [{}] %^%l%$: %v", who));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace ddp

namespace ddp {

void log_info_line(const std::string& line) {
  spdlog::info("{}", line);
}

}  // namespace ddp
