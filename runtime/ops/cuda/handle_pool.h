// ThreadHandlePool<Handle>: a library's handles per device (cuBLAS,
// cuBLASLt, cuDNN), lent to threads.
//
// These libraries want a handle used by one thread at a time, so the CUDA
// backend keeps one per thread and device. Its callers run ops from threads
// that come and go: LocalSession (and sk_local_session) runs every step's
// ranks on fresh threads, and a framework may call the engine from its own
// workers. A handle that lived and died with its thread was leaked at the
// thread's exit (with cuBLAS's own device workspace), and everything cached
// per handle (cuDNN's built graphs) was built again by the next thread: on
// every step of a local session. Here a thread keeps the handle it was lent
// for as long as it lives (one thread per handle at a time, as before) and
// gives it back to the pool when it exits; the next thread that asks for
// that device gets it again, with what is cached for it. Handles are never
// destroyed (the pools live for the process: ops may run at exit, and
// destroying a handle then would race the driver's own teardown); at most
// as many exist per device as threads ever used that device at once.
//
// Host code only (no CUDA types here): the handle is any copyable value and
// `create` makes one; tested on the host (//tests/ops:handle_pool_test).
//
// Thread safety: Get, created and available may be called from any thread.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_HANDLE_POOL_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_HANDLE_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/core/status.h"

namespace sk::ops::cuda {

template <typename Handle>
class ThreadHandlePool {
 public:
  // create(device) makes a new handle with `device` current on the calling
  // thread (the caller's job); its error is returned by Get and nothing is
  // kept, so a later Get tries again.
  using Create = std::function<StatusOr<Handle>(int device)>;

  explicit ThreadHandlePool(Create create)
      : id_(NextId()), shared_(std::make_shared<Shared>(std::move(create))) {}
  ThreadHandlePool(const ThreadHandlePool&) = delete;
  ThreadHandlePool& operator=(const ThreadHandlePool&) = delete;
  // Handles still lent stay with their threads (and are dropped, not
  // returned, when those exit); free ones are dropped. Not destroyed: see
  // the top.
  ~ThreadHandlePool() = default;

  // The calling thread's handle for `device`: the one it already holds,
  // else a free one of the pool's (made by an earlier thread), else a new
  // one from create(device). The thread holds it until it exits.
  // A thread whose lease is already gone (an op run from a thread_local's or
  // a static's destructor after it) gets a handle that is never given back.
  StatusOr<Handle> Get(int device) {
    if (LeaseGone()) return shared_->Take(device);
    thread_local Lease lease;
    auto held = lease.held.find(id_);
    if (held != lease.held.end()) {
      auto it = held->second.handles.find(device);
      if (it != held->second.handles.end()) return it->second;
    }
    StatusOr<Handle> h = shared_->Take(device);
    if (!h.ok()) return h;
    if (held == lease.held.end()) {
      held = lease.held.emplace(id_, Lent{shared_, {}}).first;
    }
    held->second.handles.emplace(device, *h);
    return h;
  }

  // Handles made for `device` so far (lent and free).
  int created(int device) const { return shared_->Count(device).first; }
  // Of those, how many wait in the pool for a thread.
  int available(int device) const { return shared_->Count(device).second; }

 private:
  // The pool proper, shared with the leases of the threads it lent to (a
  // lease that outlives the pool drops its handles instead of returning
  // them).
  struct Shared {
    explicit Shared(Create c) : create(std::move(c)) {}

    StatusOr<Handle> Take(int device) {
      {
        std::lock_guard<std::mutex> lock(mu);
        std::vector<Handle>& free = free_by_device[device];
        if (!free.empty()) {
          Handle h = free.back();
          free.pop_back();
          return h;
        }
      }
      // Made without the lock (a library's create can take milliseconds).
      StatusOr<Handle> h = create(device);
      if (h.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++created_by_device[device];
      }
      return h;
    }
    void Give(int device, Handle h) {
      std::lock_guard<std::mutex> lock(mu);
      free_by_device[device].push_back(h);
    }
    std::pair<int, int> Count(int device) {
      std::lock_guard<std::mutex> lock(mu);
      auto c = created_by_device.find(device);
      auto f = free_by_device.find(device);
      return {c == created_by_device.end() ? 0 : c->second,
              f == free_by_device.end() ? 0 : static_cast<int>(f->second.size())};
    }

    const Create create;
    std::mutex mu;
    std::map<int, std::vector<Handle>> free_by_device;
    std::map<int, int> created_by_device;
  };

  // One thread's handles from one pool.
  struct Lent {
    std::weak_ptr<Shared> pool;
    std::map<int, Handle> handles;  // by device
  };
  // One thread's handles from every pool of this Handle type, returned
  // when the thread exits. Keyed by the pool's id (never reused, so a pool
  // made after another was destroyed never matches the other's entry); an
  // entry whose pool is gone is dropped.
  struct Lease {
    std::map<uint64_t, Lent> held;
    ~Lease() {
      LeaseGone() = true;
      for (auto& [key, lent] : held) {
        if (std::shared_ptr<Shared> pool = lent.pool.lock()) {
          for (const auto& [device, h] : lent.handles) pool->Give(device, h);
        }
      }
    }
  };

  // Set when this thread's Lease has been destroyed (a trivially destructible
  // thread_local: readable until the thread is gone).
  static bool& LeaseGone() {
    thread_local bool gone = false;
    return gone;
  }

  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  const uint64_t id_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace sk::ops::cuda

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_HANDLE_POOL_H_
