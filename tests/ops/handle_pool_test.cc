// The CUDA backend's handle pool (runtime/ops/cuda/handle_pool.h), on the
// host with integers for handles: a thread keeps its handle, gives it back
// when it exits, and the next thread gets it again (what a local session's
// per-step rank threads need); threads at once hold distinct handles; a
// failed create keeps nothing.
#include "runtime/ops/cuda/handle_pool.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace sk::ops::cuda {
namespace {

// Handles 1, 2, 3, ... from one counter per pool; device d's carry d * 1000.
struct Factory {
  std::atomic<int> made{0};
  ThreadHandlePool<int>::Create Fn() {
    return [this](int device) -> StatusOr<int> { return device * 1000 + ++made; };
  }
};

// body() on a new thread, joined.
template <typename F>
void OnNewThread(F body) {
  std::thread t(body);
  t.join();
}

TEST(ThreadHandlePool, AThreadKeepsItsHandle) {
  Factory f;
  ThreadHandlePool<int> pool(f.Fn());
  OnNewThread([&] {
    StatusOr<int> a = pool.Get(0), b = pool.Get(0);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    EXPECT_EQ(pool.created(0), 1);
    EXPECT_EQ(pool.available(0), 0);
  });
  EXPECT_EQ(pool.available(0), 1) << "the exited thread gave its handle back";
}

// A local session's steps: each on fresh threads. One handle serves them all.
TEST(ThreadHandlePool, ThreadsOneAfterAnotherShareOneHandle) {
  Factory f;
  ThreadHandlePool<int> pool(f.Fn());
  std::set<int> seen;
  for (int step = 0; step < 5; ++step) {
    OnNewThread([&] {
      StatusOr<int> h = pool.Get(0);
      ASSERT_TRUE(h.ok());
      seen.insert(*h);
    });
  }
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(pool.created(0), 1);
  EXPECT_EQ(f.made.load(), 1);
}

// N ranks at once hold N distinct handles; the next steps' N threads reuse
// exactly those.
TEST(ThreadHandlePool, ThreadsAtOnceHoldDistinctHandlesAndTheNextOnesReuseThem) {
  constexpr int kThreads = 4;
  Factory f;
  ThreadHandlePool<int> pool(f.Fn());
  std::vector<std::set<int>> per_step;
  for (int step = 0; step < 3; ++step) {
    std::mutex mu;
    std::condition_variable cv;
    int holding = 0;
    std::set<int> got;
    std::vector<std::thread> threads;
    for (int r = 0; r < kThreads; ++r) {
      threads.emplace_back([&] {
        StatusOr<int> h = pool.Get(0);
        std::unique_lock<std::mutex> lock(mu);
        if (h.ok()) got.insert(*h);
        // Nobody exits (and gives back) before every thread holds one.
        ++holding;
        cv.notify_all();
        cv.wait(lock, [&] { return holding == kThreads; });
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(got.size(), static_cast<size_t>(kThreads)) << "step " << step;
    per_step.push_back(got);
  }
  EXPECT_EQ(per_step[1], per_step[0]);
  EXPECT_EQ(per_step[2], per_step[0]);
  EXPECT_EQ(pool.created(0), kThreads);
  EXPECT_EQ(pool.available(0), kThreads);
}

TEST(ThreadHandlePool, DevicesHaveTheirOwnHandles) {
  Factory f;
  ThreadHandlePool<int> pool(f.Fn());
  OnNewThread([&] {
    StatusOr<int> d0 = pool.Get(0), d1 = pool.Get(1);
    ASSERT_TRUE(d0.ok() && d1.ok());
    EXPECT_LT(*d0, 1000);
    EXPECT_GT(*d1, 1000);
  });
  OnNewThread([&] {
    // Device 1 first this time: still device 1's handle.
    StatusOr<int> d1 = pool.Get(1);
    ASSERT_TRUE(d1.ok());
    EXPECT_GT(*d1, 1000);
  });
  EXPECT_EQ(pool.created(0), 1);
  EXPECT_EQ(pool.created(1), 1);
}

TEST(ThreadHandlePool, AFailedCreateKeepsNothingAndIsTriedAgain) {
  int calls = 0;
  ThreadHandlePool<int> pool([&](int) -> StatusOr<int> {
    if (++calls == 1) return UnavailableError("cublasCreate failed: out of memory");
    return 7;
  });
  OnNewThread([&] {
    StatusOr<int> first = pool.Get(0);
    EXPECT_FALSE(first.ok());
    EXPECT_NE(first.status().ToString().find("cublasCreate failed"), std::string::npos);
    EXPECT_EQ(pool.created(0), 0);
    StatusOr<int> second = pool.Get(0);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(*second, 7);
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(pool.available(0), 1);
}

// A pool destroyed while a thread still holds its handle: the thread exits
// cleanly later, and a new pool (perhaps at the same address) never hands
// out the old pool's handle.
TEST(ThreadHandlePool, APoolDestroyedBeforeItsThreadsIsForgotten) {
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0;
  int old_handle = 0, new_handle = 0;
  auto pool = std::make_unique<ThreadHandlePool<int>>([](int) -> StatusOr<int> { return 1; });
  std::thread worker([&] {
    StatusOr<int> h = pool->Get(0);
    if (h.ok()) old_handle = *h;
    std::unique_lock<std::mutex> lock(mu);
    phase = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 2; });
    StatusOr<int> again = pool->Get(0);  // the new pool now
    if (again.ok()) new_handle = *again;
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return phase == 1; });
    pool.reset();
    pool = std::make_unique<ThreadHandlePool<int>>([](int) -> StatusOr<int> { return 2; });
    phase = 2;
    cv.notify_all();
  }
  worker.join();
  EXPECT_EQ(old_handle, 1);
  EXPECT_EQ(new_handle, 2);
  EXPECT_EQ(pool->created(0), 1);
  EXPECT_EQ(pool->available(0), 1);
}

// An op run from a thread_local's destructor after the thread's lease is
// gone (thread_locals die in reverse order of construction) still gets a
// handle, and nothing touches the destroyed lease.
ThreadHandlePool<int>* g_late_pool = nullptr;
StatusOr<int>* g_late_result = nullptr;
struct LateCaller {
  ~LateCaller() { *g_late_result = g_late_pool->Get(0); }
};

TEST(ThreadHandlePool, AGetAfterTheThreadsLeaseIsGoneStillAnswers) {
  Factory f;
  ThreadHandlePool<int> pool(f.Fn());
  StatusOr<int> late = UnavailableError("not called");
  g_late_pool = &pool;
  g_late_result = &late;
  OnNewThread([&] {
    thread_local LateCaller caller;  // constructed before the lease: destroyed after it
    (void)caller;
    ASSERT_TRUE(pool.Get(0).ok());
  });
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_GE(*late, 1);
}

}  // namespace
}  // namespace sk::ops::cuda
