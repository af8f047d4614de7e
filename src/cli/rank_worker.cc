// `pdserve rank-worker`: one tensor-parallel rank of a node, started by the node itself
// (engine/rank_workers.h), never by hand. It attaches to the group its node created (an
// inherited fd) first, so that a wrong fd is refused at once and the node knows its pid while
// it loads; then it loads its share of the model, maps its KV cache (another inherited fd) and
// runs the forward passes the node publishes until the node shuts it down (exit 0) or the group
// fails (exit 1). It ignores SIGINT and SIGTERM (its node stops it) and dies with its node
// (PR_SET_PDEATHSIG, set by the node when it starts it).
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "engine/rank_workers.h"
#include "engine/shm_tp_group.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

struct RankWorkerFlags {
  ModelFlags model;
  int rank = 0;
  int group_fd = -1;
  int kv_fd = -1;
};

// The cache's page count follows from its size: the node sized it.
Result<int> PagesOfCache(int fd, const KvLayout& one_page) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno("fstat(--kv-fd)", errno);
  const size_t page_bytes = one_page.total_bytes();
  if (st.st_size <= 0 || static_cast<size_t>(st.st_size) % page_bytes != 0) {
    return Status::InvalidArgument(
        fmt::format("--kv-fd {} holds {} bytes, not whole pages of {} bytes for this rank", fd,
                    st.st_size, page_bytes));
  }
  return static_cast<int>(static_cast<size_t>(st.st_size) / page_bytes);
}

// Ctrl-C on a terminal reaches the whole process group; the node must stop first and then shut
// its workers down in order. The node starts workers with both signals ignored, but that is not
// enough: a library's constructor (libinfinipath, through libfabric's psm provider) installs
// SIGINT/SIGTERM handlers of its own, which end the process, over the inherited SIG_IGN.
void IgnoreStopSignals() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, nullptr);
  sigaction(SIGTERM, &ignore, nullptr);
}

Status RunRankWorkerCommand(const RankWorkerFlags& f) {
  IgnoreStopSignals();
  // Before the (possibly long) load: a bad fd is an error now, and the leader sees this rank
  // attached; a group that fails meanwhile is seen at MarkReady.
  auto attached =
      ShmTpGroup::Attach(f.group_fd, f.rank, std::chrono::seconds(f.model.tp_timeout_s));
  if (!attached.ok()) {
    return attached.status().WithContext(
        "rank-worker (started by `pdserve serve|generate --tp N`, not by hand) --group-fd");
  }
  std::unique_ptr<ShmTpGroup> group = std::move(*attached);
  if (group->size() != f.model.tp) {
    return Status::InvalidArgument(fmt::format("--tp {}, but the group at --group-fd has {} ranks",
                                               f.model.tp, group->size()));
  }
  PD_RETURN_IF_ERROR(kernels::SelectPathFromEnvironment());
  PD_ASSIGN_OR_RETURN(ModelDirOptions options, LoadOptionsFromFlags(f.model));
  options.load_tokenizer = false;
  options.transformer.tp_rank = f.rank;
  PD_ASSIGN_OR_RETURN(ModelDir dir, LoadModelDir(f.model.model, options));
  Transformer& model = *dir.transformer;
  const KvLayout one_page = model.MakeKvLayout(1, f.model.page_size);
  PD_ASSIGN_OR_RETURN(const int pages, PagesOfCache(f.kv_fd, one_page));
  PD_ASSIGN_OR_RETURN(auto cache,
                      KvCache::Map(model.MakeKvLayout(pages, f.model.page_size), f.kv_fd));
  model.SetTpGroup(group.get());
  PD_LOG_INFO("rank {} of {}: {} pages of KV heads [{}, {}), kernels {}", f.rank, f.model.tp, pages,
              model.tp().kv_heads.begin, model.tp().kv_heads.end, model.kernel_path());
  return RunRankWorker(model, *cache, *group);
}

}  // namespace

void AddRankWorkerCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<RankWorkerFlags>();
  CLI::App* cmd = app.add_subcommand("rank-worker", "");  // no description: hidden from --help
  cmd->group("");
  AddModelFlags(cmd, &flags->model, /*tensor_parallel=*/true);
  cmd->add_option("--tp-rank", flags->rank, "This worker's rank")
      ->required()
      ->check(CLI::Range(1, 63));
  cmd->add_option("--group-fd", flags->group_fd, "Inherited fd of the group's region")->required();
  cmd->add_option("--kv-fd", flags->kv_fd, "Inherited fd of this rank's KV cache")->required();
  cmd->add_flag("--mtp-kv", flags->model.mtp_kv, "The cache has the MTP module's KV layer");
  cmd->callback([flags, exit_code] {
    Status s = RunRankWorkerCommand(*flags);
    *exit_code = s.ok() ? 0 : Fail(s.ToString());
  });
}

}  // namespace pdserve::cli
