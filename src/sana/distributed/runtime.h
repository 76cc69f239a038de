// The distributed runtime of one process: rendezvous through the run's store (rank 0
// hosts it: store_server.h; torchrun's agent store where torchrun has one), the
// start-up agreement and device map, the collective backend (Gloo for CPU tensors, NCCL
// for CUDA tensors when LibTorch has CUDA), failure detection through the store, and
// the few collectives the trainer uses. Every wait is bounded by dist.timeout_s; a failed
// or vanished rank makes every other rank exit. data/ and model/ never include this.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/torch_compat.h"
#include "sana/distributed/devices.h"
#include "sana/distributed/launch_env.h"
#include "sana/distributed/process_settings.h"
#include "sana/util/error.h"

namespace sana::dist {

// Another rank failed or vanished; this rank should exit with kExitPeerFailed.
class PeerFailure : public sana::PeerFailedError {
 public:
  explicit PeerFailure(const std::string& what) : PeerFailedError(what) {}
};

// dist.elastic continue: a rank of the group was declared lost (dead or hung). The
// survivors call Runtime::regroup and go on from the last committed step; without
// elasticity this is an ordinary PeerFailure (exit 3).
class RankLost : public PeerFailure {
 public:
  explicit RankLost(const std::string& what) : PeerFailure(what) {}
};

// A replacement (SANA_JOIN) whose run ended before it was taken in: nothing to do, exit 0.
class RunEnded : public sana::Error {
 public:
  explicit RunEnded(const std::string& what) : Error(what, kExitOk, "nothing to do") {}
};

// A wait ran out of dist.timeout_s.
class DistTimeout : public sana::RunError {
 public:
  explicit DistTimeout(const std::string& what) : RunError(what, "distributed error") {}
};

// Ranks were started differently (config, version, world size, devices): exit code 2.
class Disagreement : public sana::UsageError {
 public:
  explicit Disagreement(const std::string& what) : UsageError(what, "start-up check failed") {}
};

// What every rank must have in common, compared before any collective.
struct StartChecks {
  std::string version;
  std::string config_fingerprint;
};

class FailureWatch;

// A collective started with Runtime::all_reduce_async; Runtime::wait finishes it. Its
// flight-record entry ends when it is waited for, reset or destroyed, so an abandoned
// collective is never mistaken for a hung one.
class PendingCollective {
 public:
  PendingCollective() = default;
  PendingCollective(c10::intrusive_ptr<c10d::Work> work, int64_t flight_token)
      : work_(std::move(work)), token_(flight_token) {}
  PendingCollective(PendingCollective&& other) noexcept { *this = std::move(other); }
  PendingCollective& operator=(PendingCollective&& other) noexcept;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective() { reset(); }

  explicit operator bool() const { return static_cast<bool>(work_); }
  const c10::intrusive_ptr<c10d::Work>& work() const { return work_; }
  // Gives the flight-record entry its deadline, from now (the rank starts waiting).
  void arm(std::chrono::milliseconds limit);
  // Ends the flight-record entry (with `error`, if any) and drops the work.
  void reset(const std::string& error = "");

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  int64_t token_ = 0;
};

class Runtime {
 public:
  // Rendezvous, agreement, device map, backend, failure watch: in that order, each
  // bounded by dist.timeout_s. Throws LaunchEnvError, DeviceError, Disagreement,
  // DistTimeout or PeerFailure with a message naming ranks and what to do.
  // flight_dir: where this rank's flight record goes on a failure or SIGUSR1 ("": none).
  static std::unique_ptr<Runtime> start(const LaunchEnv& env, const RuntimeOptions& cfg,
                                        const StartChecks& checks, const std::string& flight_dir = "");
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // This rank and the group's size; after a regroup (dist.elastic continue) the survivors'
  // ranks are their places among the members, in the order of their original ranks.
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // The rank this process started as (the launcher's), which keys its heartbeat.
  int original_rank() const { return env_.rank; }
  // The group's members by original rank (0, 1, ..., W-1 until a regroup).
  const std::vector<int>& members() const { return members_; }
  bool elastic() const { return elastic_; }
  const LaunchEnv& env() const { return env_; }
  const RendezvousEndpoint& endpoint() const { return endpoint_; }
  const DeviceClaim& device_claim() const { return claim_; }
  const std::vector<DeviceClaim>& device_map() const { return device_map_; }
  torch::Device device() const;
  const std::string& backend_name() const { return backend_name_; }
  int threads() const { return threads_; }

  // Every rank's `mine`, in rank order, through the store (no backend needed).
  std::vector<std::string> all_gather(const std::string& name, const std::string& mine);
  // Throws Disagreement on every rank, listing which ranks hold which value.
  void agree(const std::string& what, const std::string& mine);
  // Rank 0's `value` on every rank.
  std::string broadcast_string(const std::string& value);

  // Work done by one rank while the others wait (e.g. rank-0-only previews). The worker
  // calls progress() as it goes and done() at the end; the others call wait_for_work(),
  // which returns at done(), and fails only when the worker fails or makes no progress
  // for dist.timeout_s: a long job that keeps moving never trips the timeout.
  void work_progress(const std::string& name, int64_t count);
  void work_done(const std::string& name);
  void wait_for_work(const std::string& name, int worker);

  // Backend collectives: every rank calls them in the same order.
  void barrier();
  void all_reduce(torch::Tensor& t);  // sum, in place
  void broadcast(torch::Tensor& t, int root = 0);  // from `root`, in place (host memory too, under NCCL)
  double all_reduce_sum(double value);
  // Starts a sum all-reduce and returns at once (world size 1: nothing to do, empty).
  PendingCollective all_reduce_async(torch::Tensor& t);
  // The sum over ranks into `root`'s `t` (other ranks' `t` may be overwritten: scratch);
  // started now, waited for with wait() (ZeRO stage 2's gradients, which Gloo in LibTorch
  // 1.13 cannot reduce-scatter).
  PendingCollective reduce_async(torch::Tensor& t, int root);
  // `root`'s `t` into every rank's, started now (ZeRO stage 3 fetching the next block).
  PendingCollective broadcast_async(torch::Tensor& t, int root);
  // Waits for `pending` (empty: done), turning a broken collective into PeerFailure.
  void wait(PendingCollective& pending, const char* what);
  // `send` to rank `to` while `receive` comes from rank `from`, in place (point to point:
  // every rank calls it once, in the same place, as a ring; the byte counts must pair up).
  // A step's gradients to the rank that mirrors this one's share (train/elastic/share_mirror.h).
  void send_receive(const torch::Tensor& send, int to, torch::Tensor& receive, int from);
  // Bytes of the tensors this rank has passed to backend collectives so far (sent or
  // received): what a phase moved is the difference across it.
  int64_t tensor_bytes() const { return tensor_bytes_.load(); }

  // dist.elastic continue. The step's commit, after the step's agreement and before
  // anything it changes: true when every rank of the group got this far (the step is
  // applied everywhere), else throws RankLost (discarded everywhere). The run's store
  // decides, so no two survivors ever disagree on whether a step happened. Nothing to do
  // without elasticity or on one rank.
  void commit_step(int64_t step);
  // After RankLost: the survivors agree on the members left (the first member not lost
  // decides once every member has arrived or been declared lost), drop the old backend
  // unwaited (its abandoned collectives may still run: nothing of theirs is reused) and
  // build a new one under the next generation's keys. `position`: this rank's last
  // committed step, which every survivor must share. Returns what happened, for the log.
  struct Regrouped {
    std::vector<int> lost;    // original ranks
    std::vector<int> joined;  // replacements taken in (their SANA_JOIN ids)
    int world_before = 0;
    double seconds = 0;
  };
  Regrouped regroup(int64_t position);
  // The node each member runs on, in member order: "node <GROUP_RANK>" where the launcher
  // numbers its nodes (torchrun, `sana-train launch`), else "<host name> <the address the
  // store host sees>". Read from the store once per member.
  std::vector<std::string> member_nodes();
  // Replacements (SANA_JOIN) rank 0 took in at the last committed step: the group grows by
  // them after that step (admit()); empty: none. Every rank reads the same.
  const std::vector<int>& joining() const { return joining_; }
  // After the step that named joining(): the group with them, under the next generation.
  // The joiners' Runtime::start returns at the same moment; then every rank of the new
  // group builds its trainer anew (docs/distributed.md).
  Regrouped admit();

  // Tells every other rank that this one failed (best effort, never throws).
  void fail(const std::string& reason) noexcept;
  // Orderly end: rank 0 keeps the store up until every rank is done.
  void finish();

 private:
  Runtime(LaunchEnv env, RuntimeOptions cfg);
  // The flight recorder's watchdog: an overdue store operation or collective ends the
  // process naming the store host or the collective (installed before the first one).
  void watch_deadlines();
  void connect();
  void start_checked(const StartChecks& checks);
  void join();
  void claim_devices();
  void create_backend();
  void wait_for_keys(const std::vector<std::string>& keys, const std::string& what);
  void wait_for_keys_unguarded(const std::vector<std::string>& keys, const std::string& what);
  // Runs store operations; a lost connection to rank 0's store becomes a PeerFailure.
  void guard_store(const std::function<void()>& op);
  // Acknowledges the end of the run's start-up to rank 0, which waits for everyone.
  void leave() noexcept;
  void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const char* what);
  // Starts a collective with `start` and waits for it, in the flight record as `kind`.
  void run_collective(const char* kind, int64_t bytes,
                      const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  // This process's node, as member_nodes() gives it; published under node/<original rank>.
  std::string node_key() const;
  // dist.elastic continue: a rank was declared lost since the last regroup.
  bool loss_pending();
  // Why each member declared lost since the last regroup was, "; "-separated.
  std::string lost_reasons();
  // After a failed collective: waits up to the heartbeat timeout for a declared loss and
  // throws RankLost naming it; returns when none comes.
  void throw_if_rank_lost(const std::string& what);
  std::chrono::milliseconds heartbeat() const;
  // A replacement's start (env.join_id): asks rank 0 to be taken in and waits for it
  // (dist.max_rejoin_wait_s), then joins the group's next generation.
  void join_running(const StartChecks& checks);
  // Rank 0 before its commit of `step`: the join requests that arrived, checked against
  // this run's version and config, offered under join/at/<step>.
  void offer_joins(int64_t step);
  // Every rank takes `decision` ("<original ranks>;<losses so far>", regroup/<g>/members)
  // as its group: ranks, keys and backend of the next generation. Returns the members
  // that left.
  std::vector<int> take_members(const std::string& decision);
  // regroup()'s two sides: the leader (the first member not declared lost) waits for every
  // member to arrive under `base` or be declared lost and returns the decision; the others
  // wait for it under `key`, or return "" when `leader` (if >= 0) is declared lost first.
  std::string decide_survivors(const std::string& base, int64_t position);
  std::string await_survivors(const std::string& key, int leader = -1);
  // dist.elastic continue: waits for `work` to complete, but throws RankLost as soon as a
  // loss is declared (a collective with a hung peer would wait for the backend's timeout).
  void wait_unless_lost(c10d::Work& work, const char* what);
  // The same for point-to-point work (send_receive), which Gloo completes only in wait().
  void wait_point_to_point(const std::vector<c10::intrusive_ptr<c10d::Work>>& works, const char* what);
  // Both: polls `done` until true, throwing RankLost as soon as a loss is declared.
  void poll_unless_lost(const std::function<bool()>& done, const char* what);
  // The store of the current generation's keys (gathers, work, the backend's, commits).
  c10d::Store& gen_store() { return *gen_store_; }
  // The limit of one collective before the watchdog declares it hung.
  std::chrono::milliseconds collective_limit() const;
  std::chrono::milliseconds timeout() const;

  LaunchEnv env_;
  RuntimeOptions cfg_;
  RendezvousEndpoint endpoint_;
  std::string local_address_;  // this host's address as the store host sees it
  std::string host_;
  DeviceClaim claim_;
  std::vector<DeviceClaim> device_map_;
  std::string backend_name_ = "none";
  int threads_ = 1;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> gen_store_;  // store_ itself in generation 0
  c10::intrusive_ptr<compat::CollectiveBackend> backend_;
  int rank_ = 0, world_ = 1;
  std::vector<int> members_;
  bool elastic_ = false;
  int generation_ = 0;
  int64_t losses_seen_ = 0;  // declared losses already handled by a regroup
  int64_t join_requests_read_ = 0;  // rank 0: join/request/<n> read so far
  std::vector<int> joining_;        // offered at the last committed step
  std::map<int, std::string> node_of_;  // member_nodes(), by original rank
  StartChecks checks_;              // what a joiner must match
  std::unique_ptr<FailureWatch> watch_;
  int64_t gather_generation_ = 0;
  std::atomic<int64_t> tensor_bytes_{0};
  bool finished_ = false;
};


// The store key prefix every sana-train rank uses (inside torchrun's attempt prefix).
constexpr const char* kStorePrefix = "sana/";

// Opens the store of `endpoint` (server or client), bounded by `timeout`. Every operation
// on it is in the flight record; one that is not answered within `quick_limit` (set,
// check, add...) or its own timeout plus a margin (get, wait) is overdue.
// keep_in_record: false for the failure watch's beats, which would crowd out the rest.
// The store is ours (run_store.h: rank 0 hosts it), or under torchrun's agent store
// LibTorch's TCPStore client. local_address: set to this host's address as the store
// host sees it (our store only; Gloo listens there on a multi-host run).
c10::intrusive_ptr<c10d::Store> open_store(const RendezvousEndpoint& endpoint,
                                           std::chrono::milliseconds timeout,
                                           std::chrono::milliseconds quick_limit,
                                           bool keep_in_record = true,
                                           std::string* local_address = nullptr);

// The prefix of every key the run keeps in its store (inside torchrun's attempt prefix).
std::string store_key_prefix(const RendezvousEndpoint& endpoint);

// Milliseconds since the store host last saw `key` (as the run names it, unprefixed)
// written, -1 when there is no such key; nullopt when the store cannot tell (torchrun's
// TCPStore). `store`: what open_store returned for `endpoint`.
std::optional<int64_t> store_key_age_ms(c10d::Store& store, const RendezvousEndpoint& endpoint,
                                        const std::string& key);

}  // namespace sana::dist
