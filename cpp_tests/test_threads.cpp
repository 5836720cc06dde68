// The C API from several host threads at once: results equal the single-threaded ones bit for
// bit (CPU backend always; the CUDA backend on one stream per thread where a device exists), and
// the error state is per thread: between a failing call and the check of kf_last_error(), every
// other thread has made its own call (barriers), so a shared message would show up as wrong.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gpu_util.h"

using namespace kft;

namespace {

constexpr int kThreads = 8;
constexpr int kRounds = 6;


// Failures seen by worker threads, asserted on the main thread.
class Failures {
 public:
  void add(std::string what) {
    std::lock_guard<std::mutex> lock(m_);
    ++count_;
    if (list_.size() < 20) list_.push_back(std::move(what));
  }
  int count() const { return count_; }
  std::string text() const {
    std::string s;
    for (const auto& f : list_) s += "  " + f + "\n";
    return s;
  }

 private:
  mutable std::mutex m_;
  std::vector<std::string> list_;
  int count_ = 0;
};

std::string who(int t, int round) { return "thread " + std::to_string(t) + " round " + std::to_string(round) + ": "; }

// Shapes differ per thread so the threads run different code paths at the same time.
Problem thread_problem(int t, std::mt19937_64& rng) {
  static const int h_qs[] = {16, 8, 32, 128, 1, 64, 16, 20};
  static const int pages[] = {16, 64, 32, 1, 128, 8, 256, 4};
  static const int workers[] = {4, 1, 7, 3, 16, 2, 5, 9};
  Problem pr;
  pr.bf16 = t % 2 == 0;
  pr.batch = 1 + t % 4;
  pr.s_q = 1 + t % 3;
  pr.h_q = h_qs[t % 8];
  pr.page_size = pages[t % 8];
  pr.num_workers = workers[t % 8];
  pr.seqlens = random_lengths(rng, pr.batch, 400, 0.2);
  return pr;
}

// A thread-specific invalid call: h_q = 200 + 10 t + round names the thread and the round.
kf_status bad_call(int t, int round, int* value) {
  *value = 200 + 10 * t + round;
  size_t bytes = 0;
  return kf_mla_workspace_size(2, *value, 1, 4, &bytes);
}

// After bad_call, this thread's message must name its own value and nobody else's.
void check_own_error(int t, int round, int value, Failures& failures) {
  const std::string msg = kf_last_error();
  const std::string want = "h_q: expected 1..128, got " + std::to_string(value);
  if (msg != want) failures.add(who(t, round) + "kf_last_error() = \"" + msg + "\", expected \"" + want + "\"");
}

TEST(Threads, CpuCallsMatchSingleThreaded) {
  auto rng = test_rng();
  std::vector<Built> built;
  std::vector<std::vector<uint8_t>> want_out, want_lse, want_meta;
  for (int t = 0; t < kThreads; ++t) {
    built.push_back(build_problem(thread_problem(t, rng), rng));
    ASSERT_EQ(run_decode(built.back()), KF_SUCCESS) << kf_last_error();
    want_out.push_back(built.back().out.snapshot());
    want_lse.push_back(built.back().lse.snapshot());
    want_meta.push_back(built.back().metadata.snapshot());
  }
  // One more problem whose inputs every thread reads at once, each into its own outputs.
  Problem spr;
  spr.batch = 3;
  spr.s_q = 2;
  spr.h_q = 16;
  spr.num_workers = 6;
  spr.seqlens = {300, 0, 129};
  Built shared = build_problem(spr, rng);
  ASSERT_EQ(run_decode(shared), KF_SUCCESS) << kf_last_error();
  const auto shared_out = shared.out.snapshot(), shared_lse = shared.lse.snapshot();
  std::vector<HostTensor> s_out, s_lse, s_ws;
  size_t ws_bytes = 0;
  ASSERT_EQ(kf_mla_workspace_size(spr.batch, spr.h_q, spr.s_q, spr.num_workers, &ws_bytes), KF_SUCCESS);
  for (int t = 0; t < kThreads; ++t) {
    s_out.emplace_back(kBF16, std::vector<int64_t>{spr.batch, spr.s_q, spr.h_q, 512});
    s_lse.emplace_back(kF32, std::vector<int64_t>{spr.batch, spr.h_q, spr.s_q});
    s_ws.emplace_back(kU8, std::vector<int64_t>{int64_t(ws_bytes)});
  }
  // Appends: each thread writes the same rows into its own cache; the single-threaded bytes first.
  const int n = 40, num_pages = 4, ps = 16;
  HostTensor kv(kBF16, {n, 576}), slots(kI64, {n});
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_bf16(normal(rng));
  for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 9 == 8 ? -1 : (i * 37) % (num_pages * ps);
  HostTensor want_cache(kBF16, {num_pages, ps, 576});
  want_cache.fill<uint16_t>(nan_16(true));
  ASSERT_EQ(kf_cache_append(kv.dl(), want_cache.dl(), KF_KV_BF16, slots.dl(), nullptr, nullptr), KF_SUCCESS);
  std::vector<HostTensor> caches;
  for (int t = 0; t < kThreads; ++t) caches.emplace_back(kBF16, std::vector<int64_t>{num_pages, ps, 576});

  // DLTensors of the inputs every thread reads, taken once here: HostTensor::dl() writes.
  DLTensor *sq = shared.q_t.dl(), *scache = shared.cache.dl(), *sbt = shared.block_table.dl(),
           *ssl = shared.cache_seqlens.dl(), *smd = shared.metadata.dl(), *dkv = kv.dl(), *dslots = slots.dl();
  const std::vector<uint8_t> want_cache_bytes = want_cache.snapshot();

  Failures failures;
  Barrier barrier(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Built& b = built[t];
      for (int round = 0; round < kRounds; ++round) {
        // Every other round this thread fails first, then all check their own state.
        const bool fails = (t + round) % 2 == 0;
        int value = 0;
        if (fails && bad_call(t, round, &value) != KF_ERROR_INVALID_ARGUMENT)
          failures.add(who(t, round) + "invalid h_q accepted");
        barrier.arrive_and_wait();  // every thread has made its failing call (or none)
        if (fails) check_own_error(t, round, value, failures);
        barrier.arrive_and_wait();

        // Decode of its own problem, from scratch: poisoned metadata and outputs.
        b.metadata.fill<int32_t>(0);
        b.out.fill<uint16_t>(nan_16(b.pr.bf16));
        b.lse.fill<float>(NAN);
        const kf_status m =
            kf_mla_metadata_for_format(b.cache_seqlens.dl(), b.pr.h_q, b.pr.s_q, b.pr.num_workers,
                                       KF_KV_BF16, b.metadata.dl(), nullptr);
        const kf_status d = run_decode(b);
        if (m != KF_SUCCESS || d != KF_SUCCESS) failures.add(who(t, round) + "decode failed: " + kf_last_error());
        if (std::string(kf_last_error()) != "")
          failures.add(who(t, round) + "message left after a successful call: " + kf_last_error());
        if (b.metadata.snapshot() != want_meta[t]) failures.add(who(t, round) + "metadata differs");
        if (b.out.snapshot() != want_out[t] || b.lse.snapshot() != want_lse[t])
          failures.add(who(t, round) + "out/lse differ from the single-threaded bits");

        // The shared inputs, into this thread's outputs.
        s_out[t].fill<uint16_t>(nan_16(true));
        s_lse[t].fill<float>(NAN);
        s_ws[t].fill<uint8_t>(0xff);
        const kf_status sd = kf_mla_decode(sq, scache, KF_KV_BF16, sbt, ssl, smd, spr.scale, s_out[t].dl(),
                                           s_lse[t].dl(), s_ws[t].dl(), nullptr, nullptr);
        if (sd != KF_SUCCESS) failures.add(who(t, round) + "shared decode failed: " + kf_last_error());
        if (s_out[t].snapshot() != shared_out || s_lse[t].snapshot() != shared_lse)
          failures.add(who(t, round) + "shared-input decode differs");

        // Append into its own cache.
        caches[t].fill<uint16_t>(nan_16(true));
        if (kf_cache_append(dkv, caches[t].dl(), KF_KV_BF16, dslots, nullptr, nullptr) != KF_SUCCESS)
          failures.add(who(t, round) + "append failed: " + kf_last_error());
        if (caches[t].snapshot() != want_cache_bytes) failures.add(who(t, round) + "appended bytes differ");
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.count(), 0) << failures.text();
}

// The per-thread message alone, with more threads than cores and many rounds: a thread that
// succeeds sees "", one that failed sees its own message, whatever the others did meanwhile.
TEST(Threads, ErrorStateIsPerThread) {
  constexpr int kMany = 16, kManyRounds = 50;
  Failures failures;
  Barrier barrier(kMany);
  std::vector<std::thread> threads;
  for (int t = 0; t < kMany; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < kManyRounds; ++round) {
        const bool fails = (t * 7 + round) % 3 != 0;
        int value = 0;
        size_t elems = 0;
        if (fails) {
          if (bad_call(t, round, &value) != KF_ERROR_INVALID_ARGUMENT) failures.add(who(t, round) + "accepted");
        } else if (kf_mla_metadata_size(4, 2, &elems) != KF_SUCCESS) {
          failures.add(who(t, round) + "valid call failed: " + kf_last_error());
        }
        barrier.arrive_and_wait();
        if (fails) {
          check_own_error(t, round, value, failures);
        } else if (std::string(kf_last_error()) != "") {
          failures.add(who(t, round) + "sees a message after its successful call: " + kf_last_error());
        }
        barrier.arrive_and_wait();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.count(), 0) << failures.text();
}

#if KF_TESTS_WITH_CUDA

// One thread's GPU decode: its own buffers and stream.
struct GpuJob {
  explicit GpuJob(Built& b)
      : b(b), q(b.q_t), cache(b.cache), bt(b.block_table), sl(b.cache_seqlens), md(b.metadata), out(b.out),
        lse(b.lse), ws(b.workspace) {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) stream = nullptr;
  }
  ~GpuJob() {
    if (stream) cudaStreamDestroy(stream);
  }
  bool ok() const { return stream && q.ok() && cache.ok() && bt.ok() && sl.ok() && md.ok() && out.ok() && lse.ok() && ws.ok(); }
  // Poisons out/lse/metadata on the stream, runs metadata + decode, brings out/lse back.
  std::string run(std::vector<uint8_t>* o, std::vector<uint8_t>* l) {
    cudaMemsetAsync(out.ptr(), 0xff, out.bytes(), stream);
    cudaMemsetAsync(lse.ptr(), 0xff, lse.bytes(), stream);
    cudaMemsetAsync(md.ptr(), 0, md.bytes(), stream);
    const Problem& pr = b.pr;
    if (kf_mla_metadata_for_format(sl.dl(), pr.h_q, pr.s_q, pr.num_workers, KF_KV_BF16, md.dl(),
                                   stream) != KF_SUCCESS)
      return std::string("metadata: ") + kf_last_error();
    if (kf_mla_decode(q.dl(), cache.dl(), pr.bf16 ? KF_KV_BF16 : KF_KV_FP16, bt.dl(), sl.dl(), md.dl(), pr.scale,
                      out.dl(), lse.dl(), ws.dl(), nullptr, stream) != KF_SUCCESS)
      return std::string("decode: ") + kf_last_error();
    o->resize(out.bytes());
    l->resize(lse.bytes());
    cudaMemcpyAsync(o->data(), out.ptr(), out.bytes(), cudaMemcpyDeviceToHost, stream);
    cudaMemcpyAsync(l->data(), lse.ptr(), lse.bytes(), cudaMemcpyDeviceToHost, stream);
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return std::string("CUDA: ") + cudaGetErrorString(e);
    return "";
  }
  Built& b;
  DeviceTensor q, cache, bt, sl, md, out, lse, ws;
  cudaStream_t stream = nullptr;
};

#endif  // KF_TESTS_WITH_CUDA

// Even threads decode on the GPU (one stream each), odd threads on the CPU, all at once; GPU
// results equal the same thread's single-threaded GPU bits, CPU results the CPU bits.
TEST(GpuThreads, StreamsFromManyThreadsMatchSingleThreaded) {
#if KF_TESTS_WITH_CUDA
  if (kf_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto rng = test_rng();
  std::vector<Built> built;
  for (int t = 0; t < kThreads; ++t) {
    Problem pr = thread_problem(t, rng);
    if (t % 2 == 0) {
      static const int gpu_pages[] = {16, 32, 64, 64};
      pr.page_size = gpu_pages[(t / 2) % 4];  // page sizes every GPU build has
      pr.seqlens = random_lengths(rng, pr.batch, 2000, 0.2);
    }
    built.push_back(build_problem(pr, rng));
  }
  std::vector<std::unique_ptr<GpuJob>> jobs(kThreads);
  std::vector<std::vector<uint8_t>> want_out(kThreads), want_lse(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    if (t % 2 == 0) {
      jobs[t] = std::make_unique<GpuJob>(built[t]);
      ASSERT_TRUE(jobs[t]->ok()) << "CUDA allocation failed";
      const std::string err = jobs[t]->run(&want_out[t], &want_lse[t]);
      ASSERT_EQ(err, "") << "thread " << t;
    } else {
      ASSERT_EQ(run_decode(built[t]), KF_SUCCESS) << kf_last_error();
      want_out[t] = built[t].out.snapshot();
      want_lse[t] = built[t].lse.snapshot();
    }
  }

  Failures failures;
  Barrier barrier(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<uint8_t> o, l;
      for (int round = 0; round < kRounds; ++round) {
        const bool fails = (t + round) % 2 == 0;
        int value = 0;
        if (fails) {
          if (t % 2 == 0) {  // a GPU call that names the thread: workers beyond the limit
            value = 100000 + t * 100 + round;
            GpuJob& j = *jobs[t];
            if (kf_mla_metadata_for_format(j.sl.dl(), 16, 1, value, KF_KV_BF16, j.md.dl(),
                                           j.stream) != KF_ERROR_INVALID_ARGUMENT)
              failures.add(who(t, round) + "num_workers " + std::to_string(value) + " accepted");
          } else if (bad_call(t, round, &value) != KF_ERROR_INVALID_ARGUMENT) {
            failures.add(who(t, round) + "invalid h_q accepted");
          }
        }
        barrier.arrive_and_wait();
        if (fails && t % 2 == 0) {
          const std::string want = "num_workers: expected 1..65536, got " + std::to_string(value);
          if (kf_last_error() != want)
            failures.add(who(t, round) + "kf_last_error() = \"" + kf_last_error() + "\", expected \"" + want + "\"");
        } else if (fails) {
          check_own_error(t, round, value, failures);
        }
        barrier.arrive_and_wait();

        if (t % 2 == 0) {
          const std::string err = jobs[t]->run(&o, &l);
          if (!err.empty()) failures.add(who(t, round) + err);
          else if (o != want_out[t] || l != want_lse[t]) failures.add(who(t, round) + "GPU bits differ");
        } else {
          Built& b = built[t];
          b.out.fill<uint16_t>(nan_16(b.pr.bf16));
          b.lse.fill<float>(NAN);
          if (run_decode(b) != KF_SUCCESS) failures.add(who(t, round) + kf_last_error());
          else if (b.out.snapshot() != want_out[t] || b.lse.snapshot() != want_lse[t])
            failures.add(who(t, round) + "CPU bits differ");
        }
        if (std::string(kf_last_error()) != "")
          failures.add(who(t, round) + "message left after a successful call: " + kf_last_error());
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.count(), 0) << failures.text();
#else
  GTEST_SKIP() << "built without CUDA (KF_WITH_CUDA=OFF)";
#endif
}

}  // namespace
