#include "sana/distributed/runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <thread>

#include "sana/distributed/backend_factory.h"
#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/launcher_link.h"
#include "sana/distributed/store_value.h"
#include "sana/distributed/watched_store.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

using store_value::bytes;
using store_value::text;

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Collectives in flight

PendingCollective& PendingCollective::operator=(PendingCollective&& other) noexcept {
  if (this != &other) {
    reset();
    work_ = std::move(other.work_);
    token_ = std::exchange(other.token_, 0);
  }
  return *this;
}

void PendingCollective::arm(std::chrono::milliseconds limit) {
  if (token_ != 0) FlightRecorder::process().arm(token_, limit);
}

void PendingCollective::reset(const std::string& error) {
  if (token_ != 0) FlightRecorder::process().end(token_, error);
  token_ = 0;
  work_.reset();
}

// ---------------------------------------------------------------------------------------
// Start-up

Runtime::Runtime(LaunchEnv env, RuntimeOptions cfg)
    : env_(std::move(env)), cfg_(std::move(cfg)), host_(hostname()), rank_(env_.rank), world_(env_.world_size) {
  for (int r = 0; r < world_; ++r) members_.push_back(r);
  elastic_ = cfg_.elastic_continue && world_ > 1;
  if (env_.join_id >= 0) env_.rank = env_.join_id;  // a replacement: its own identity in the store
}

Runtime::~Runtime() {
  if (watch_) watch_->stop();
  // The handler describes this runtime's store; nothing of it is waited on any more.
  FlightRecorder::process().set_overdue_handler(nullptr);
}

std::chrono::milliseconds Runtime::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(cfg_.timeout_s * 1000));
}

std::unique_ptr<Runtime> Runtime::start(const LaunchEnv& env, const RuntimeOptions& cfg,
                                        const StartChecks& checks, const std::string& flight_dir) {
  FlightRecorder::process().set_identity(env.join_id >= 0 ? env.join_id : env.rank, env.world_size, flight_dir);
  std::unique_ptr<Runtime> rt(new Runtime(env, cfg));
  // A lost rank no longer stops the others; one stopped past the heartbeat timeout is lost.
  if (rt->elastic_) tell_launcher(fmt::format("elastic {}", static_cast<int64_t>(cfg.heartbeat_timeout_s * 1000)));
  rt->threads_ = threads_per_process(cfg, env, usable_cores(), omp_num_threads_from_env());
  set_compute_threads(rt->threads_);
  keep_freed_memory();
  if (env.world_size > 1) rt->connect();
  rt->checks_ = checks;
  try {
    if (env.join_id >= 0) {
      rt->join_running(checks);
      return rt;
    }
    rt->start_checked(checks);
  } catch (const Disagreement&) {
    rt->leave();  // every rank found it: nobody to tell, but rank 0 must outlive the reads
    throw;
  } catch (const DeviceError&) {
    rt->leave();
    throw;
  } catch (const PeerFailure& e) {
    FlightRecorder::process().dump(e.what());
    rt->leave();
    throw;
  } catch (const std::exception& e) {
    rt->fail(short_error(e));
    throw;
  }
  return rt;
}

void Runtime::start_checked(const StartChecks& checks) {
  if (world_size() > 1) {
    join();
    agree("world size", std::to_string(world_size()));
    agree("program version", checks.version);
    agree("config (fingerprint of the resolved config)", checks.config_fingerprint);
  }
  claim_devices();
  backend_name_ = choose_backend(cfg_, claim_, nccl_available());
  if (world_size() > 1) create_backend();
}

// Every rank publishes its device (or why it has none) before any backend exists, so
// a bad device map is reported by every rank instead of surfacing as an NCCL error.
void Runtime::claim_devices() {
  VisibleDevices visible{cfg_.injected_cuda_devices, cfg_.inject_cuda_devices};
  if (!visible.injected) visible = visible_cuda_devices();
  std::string mine;
  try {
    claim_ = choose_device(env_, cfg_, visible, host_);
    mine = "ok\t" + claim_.encode();
  } catch (const DeviceError& e) {
    mine = std::string("error\t") + e.what();
  }
  std::vector<std::string> problems;
  for (const auto& line : all_gather("device", mine)) {
    const std::string body = line.substr(line.find('\t') + 1);
    if (line.rfind("ok\t", 0) == 0) {
      device_map_.push_back(DeviceClaim::decode(body));
    } else {
      problems.push_back(body);
    }
  }
  const auto clashes = find_device_clashes(device_map_, cfg_.allow_shared_device);
  problems.insert(problems.end(), clashes.begin(), clashes.end());
  if (!problems.empty()) throw DeviceError(fmt::format("{}", fmt::join(problems, "\n")));
  // Injected device lists (tests on machines without a GPU) name devices that do not exist.
  if (claim_.kind == "cuda" && !visible.injected) use_cuda_device(claim_.index);
}

void Runtime::connect() {
  endpoint_ = resolve_endpoint(env_, cfg_.master_addr, static_cast<int>(cfg_.master_port));
  log::debug("rendezvous at {}:{}{}", endpoint_.host, endpoint_.port,
             endpoint_.server ? " (hosting the store)" : "");
  if (elastic_ && endpoint_.server) tell_launcher(fmt::format("store host {}", original_rank()));  // not to be lost
  watch_deadlines();
  store_ = open_store(endpoint_, timeout(), timeout(), true, &local_address_);
  gen_store_ = store_;
}

std::chrono::milliseconds Runtime::collective_limit() const {
  return timeout() + WatchedStore::kWaitMargin;
}

void Runtime::watch_deadlines() {
  OverdueContext ctx;
  ctx.rank = rank();
  ctx.store_address = fmt::format("{}:{}", endpoint_.host, endpoint_.port);
  ctx.store_host = endpoint_.host_name();
  ctx.hosts_store = endpoint_.server;
  ctx.timeout_s = cfg_.timeout_s;
  FlightRecorder::install_sigusr1();  // also starts the watchdog
  FlightRecorder::process().set_overdue_handler([ctx](const FlightEntry& overdue) {
    const auto [reason, code] = describe_overdue(overdue, ctx);
    exit_with_record(reason, code);
  });
}

std::chrono::milliseconds Runtime::heartbeat() const {
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(cfg_.heartbeat_timeout_s, cfg_.timeout_s) * 1000));
}

void Runtime::join() {
  guard_store([&] {
    store_->set("join/" + std::to_string(rank()), bytes(fmt::format("{} pid {}", host_, getpid())));
    store_->set("node/" + std::to_string(rank()), bytes(node_key()));
  });
  std::vector<std::string> all;
  for (int r = 0; r < world_size(); ++r) all.push_back("join/" + std::to_string(r));
  wait_for_keys(all, "joining the rendezvous");
  watch_ = std::make_unique<FailureWatch>(endpoint_, rank(), world_size(), heartbeat(), elastic_);
}

void Runtime::wait_for_keys(const std::vector<std::string>& wanted, const std::string& what) {
  guard_store([&] { wait_for_keys_unguarded(wanted, what); });
}

void Runtime::guard_store(const std::function<void()>& op) {
  try {
    op();
  } catch (const PeerFailure&) {
    throw;
  } catch (const DistTimeout&) {
    throw;
  } catch (const std::exception& e) {
    if (endpoint_.server) throw;
    throw PeerFailure(store_lost_reason(endpoint_, rank(), e));
  }
}

void Runtime::wait_for_keys_unguarded(const std::vector<std::string>& wanted,
                                      const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  while (!gen_store_->check(wanted)) {
    const std::string failure = published_failure(*store_);
    if (!failure.empty()) {
      store_->set(keys::ack(original_rank()), bytes("1"));
      throw PeerFailure(failure);
    }
    if (elastic_ && loss_pending()) throw RankLost(fmt::format("a rank was lost while {}", what));
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<std::string> missing;
      for (const auto& k : wanted) {
        if (!gen_store_->check({k})) missing.push_back(k.substr(k.rfind('/') + 1));
      }
      std::vector<int> ranks;
      for (const auto& m : missing) ranks.push_back(std::atoi(m.c_str()));
      throw DistTimeout(fmt::format(
          "timed out after {} s {}: no word from {} (stuck, crashed, not started, or started "
          "with another MASTER_ADDR/MASTER_PORT or world size)",
          cfg_.timeout_s, what, rank_list(ranks)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Runtime::create_backend() {
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("pg/", gen_store_);
  try {
    if (backend_name_ == "nccl") {
      backend_ = make_nccl_backend(pg_store, rank(), world_size(), timeout());
    } else {
      // Gloo listens on loopback for a single-host run, else on the address that reaches
      // the store host (never on every interface).
      const std::string listen = env_.local_world_size == env_.world_size ? "127.0.0.1" : local_address_;
      backend_ = make_gloo_backend(pg_store, rank(), world_size(), timeout(), cfg_.socket_ifname, listen);
    }
  } catch (const PeerFailure&) {
    throw;
  } catch (const LaunchEnvError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string failure = published_failure_or_empty(*store_);
    if (!failure.empty()) throw PeerFailure(failure);
    throw DistTimeout(fmt::format("creating the {} backend failed: {}", backend_name_, short_error(e)));
  }
}

torch::Device Runtime::device() const {
  if (claim_.kind == "cuda" && torch::cuda::is_available()) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(claim_.index));
  }
  return torch::Device(torch::kCPU);
}

// ---------------------------------------------------------------------------------------
// Backend collectives

void Runtime::wait_work(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    if (elastic_) wait_unless_lost(*work, what);
    work->wait();
  } catch (const RankLost&) {
    throw;
  } catch (const std::exception& e) {
    // Name the failed rank when it already told the store; else say what we saw, and
    // which rank was behind by the heartbeats' collective counts.
    std::string known = published_failure_or_empty(*store_);
    if (!known.empty()) throw PeerFailure(known);
    if (elastic_) throw_if_rank_lost(fmt::format("{} #{} failed ({})", what,
                                                 FlightRecorder::process().collectives_started(), short_error(e)));
    const std::string silent = silent_ranks(*store_, env_.world_size, original_rank());
    known = published_failure_or_empty(*store_);  // rank 0's watch may have named it meanwhile
    if (!known.empty()) throw PeerFailure(known);
    const std::string progress = collective_progress(*store_, env_.world_size);
    throw PeerFailure(fmt::format("{} #{} failed ({}); {}{}{}", what, FlightRecorder::process().collectives_started(),
                                  short_error(e), silent.empty() ? "another rank has probably failed" : silent,
                                  progress.empty() ? "" : "; ", progress));
  }
}

void Runtime::run_collective(const char* kind, int64_t bytes,
                             const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  FlightOp record(OpFamily::collective, kind, "", bytes, collective_limit());
  tensor_bytes_ += bytes;
  try {
    wait_work(start(), kind);
  } catch (const std::exception& e) {
    record.failed(short_error(e));
    throw;
  }
}

void Runtime::barrier() {
  if (world_size() == 1) return;
  run_collective("barrier", 0, [&] {
    return backend_->barrier(compat::barrier_options(backend_name_ == "nccl" ? claim_.index : -1));
  });
}

void Runtime::all_reduce(torch::Tensor& t) {
  if (world_size() == 1) return;
  std::vector<torch::Tensor> tensors{t};
  run_collective("all-reduce", static_cast<int64_t>(t.nbytes()), [&] { return backend_->allreduce(tensors); });
}

namespace {

// Gloo takes no bfloat16 (LibTorch 1.13's) and no float8 (a frozen base's fp8 codes): their
// bytes go as bytes, exactly.
torch::Tensor as_gloo_sends(const torch::Tensor& t) {
  const bool as_bytes = t.scalar_type() == torch::kBFloat16 || c10::isFloat8Type(t.scalar_type());
  return as_bytes ? t.view({-1}).view(torch::kByte) : t;
}

}  // namespace

void Runtime::broadcast(torch::Tensor& t, int root) {
  if (world_size() == 1) return;
  if (t.is_cpu() && backend_name_ == "nccl") {  // NCCL sends device memory: through a device copy
    auto staged = t.to(device());
    broadcast(staged, root);
    t.copy_(staged);
    return;
  }
  std::vector<torch::Tensor> tensors{as_gloo_sends(t)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  run_collective("broadcast", static_cast<int64_t>(t.nbytes()), [&] { return backend_->broadcast(tensors, opts); });
}

namespace {

// Starts `launch`'s collective with a flight-record entry that has no deadline yet: this
// rank's own work may run long before it waits (Runtime::wait arms it).
template <typename Launch>
PendingCollective start_async(const char* name, const torch::Tensor& t, Launch&& launch) {
  const int64_t token = FlightRecorder::process().begin(OpFamily::collective, name, "",
                                                        static_cast<int64_t>(t.nbytes()), std::chrono::milliseconds(0));
  try {
    return PendingCollective(launch(), token);
  } catch (const std::exception& e) {
    FlightRecorder::process().end(token, short_error(e));
    throw;
  }
}

}  // namespace

PendingCollective Runtime::all_reduce_async(torch::Tensor& t) {
  if (world_size() == 1) return {};
  std::vector<torch::Tensor> tensors{t};
  tensor_bytes_ += static_cast<int64_t>(t.nbytes());
  return start_async("all-reduce (async)", t, [&] { return backend_->allreduce(tensors); });
}

PendingCollective Runtime::reduce_async(torch::Tensor& t, int root) {
  if (world_size() == 1) return {};
  std::vector<torch::Tensor> tensors{t};
  c10d::ReduceOptions opts;
  opts.rootRank = root;
  tensor_bytes_ += static_cast<int64_t>(t.nbytes());
  return start_async("reduce (async)", t, [&] { return backend_->reduce(tensors, opts); });
}

PendingCollective Runtime::broadcast_async(torch::Tensor& t, int root) {
  if (world_size() == 1) return {};
  std::vector<torch::Tensor> tensors{t};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  tensor_bytes_ += static_cast<int64_t>(t.nbytes());
  return start_async("broadcast (async)", t, [&] { return backend_->broadcast(tensors, opts); });
}

void Runtime::wait(PendingCollective& pending, const char* what) {
  if (!pending) return;
  pending.arm(collective_limit());
  try {
    wait_work(pending.work(), what);
  } catch (const std::exception& e) {
    pending.reset(short_error(e));
    throw;
  }
  pending.reset();
}

void Runtime::send_receive(const torch::Tensor& send, int to, torch::Tensor& receive, int from) {
  if (world_size() == 1) return;
  std::vector<torch::Tensor> out{as_gloo_sends(send)}, in{as_gloo_sends(receive)};
  const int64_t bytes = static_cast<int64_t>(send.nbytes() + receive.nbytes());
  FlightOp record(OpFamily::collective, "send/receive", "", bytes, collective_limit());
  tensor_bytes_ += bytes;
  try {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    if (receive.numel() > 0) works.push_back(backend_->recv(in, from, /*tag=*/0));
    if (send.numel() > 0) works.push_back(backend_->send(out, to, /*tag=*/0));
    if (!elastic_) {
      for (auto& w : works) wait_work(w, "send/receive");
    } else {
      wait_point_to_point(works, "send/receive");
    }
  } catch (const std::exception& e) {
    record.failed(short_error(e));
    throw;
  }
}

double Runtime::all_reduce_sum(double value) {
  auto t = torch::tensor({value}, torch::dtype(torch::kFloat64).device(device()));
  all_reduce(t);
  return t.item<double>();
}

// ---------------------------------------------------------------------------------------
// The end

void Runtime::leave() noexcept {
  if (!store_) return;
  if (!endpoint_.server && watch_) watch_->stop();
  try {
    store_->set(keys::ack(original_rank()), bytes("1"));
    if (endpoint_.server) wait_for_acks(*store_, env_.world_size, std::chrono::seconds(10));
  } catch (const std::exception&) {
  }
}

void Runtime::fail(const std::string& reason) noexcept {
  if (!store_) return;
  // Our own watcher would read the failure we publish and exit 3, hiding the cause.
  if (watch_) watch_->stop();
  const std::string path = FlightRecorder::process().dump(reason);
  if (!path.empty()) log::error("flight record of this rank: {}", path);
  publish_failure(*store_, fmt::format("rank {} on {} failed: {}", rank(), host_, reason));
  try {
    store_->set(keys::ack(original_rank()), bytes("1"));
    if (endpoint_.server) wait_for_acks(*store_, env_.world_size, std::chrono::seconds(5));
  } catch (const std::exception&) {
  }
}

void Runtime::finish() {
  if (finished_ || !store_) return;
  finished_ = true;
  // A client's watcher must stop before rank 0 may close the store; rank 0 keeps
  // watching while it waits for everyone.
  if (!endpoint_.server && watch_) watch_->stop();
  guard_store([&] { store_->set(keys::finished(original_rank()), bytes("1")); });
  if (elastic_ && rank_ == 0) guard_store([&] { store_->set("join/closed", bytes("1")); });  // replacements: go home
  if (endpoint_.server) {
    std::vector<std::string> all;
    for (int r : members_) all.push_back(keys::finished(r));
    guard_store([&] {  // base keys: no generation prefix
      const auto deadline = std::chrono::steady_clock::now() + timeout();
      while (!store_->check(all)) {
        const std::string failure = published_failure(*store_);
        if (!failure.empty()) throw PeerFailure(failure);
        if (std::chrono::steady_clock::now() > deadline) {
          throw DistTimeout(fmt::format("timed out after {} s waiting for every rank to finish", cfg_.timeout_s));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  if (watch_) watch_->stop();
}

}  // namespace sana::dist
