// Every argument error of the C API, one parameterized case per bad argument: each starts from a
// valid call, breaks one thing, and checks the status, that the message names the argument, and
// that nothing was written.
#include <functional>

#include "test_util.h"

using namespace kft;

namespace {

// A DLTensor copy with its own shape/strides storage, so a case can change them freely.
struct TArg {
  DLTensor t{};
  int64_t shape[8]{}, strides[8]{};
  bool present = true, has_shape = true, has_strides = false;

  TArg() = default;
  explicit TArg(const DLTensor* src) {
    t = *src;
    for (int i = 0; i < src->ndim; ++i) {
      shape[i] = src->shape[i];
      strides[i] = src->strides ? src->strides[i] : 0;
    }
    has_strides = src->strides != nullptr;
  }
  TArg(const TArg& o) { *this = o; }
  TArg& operator=(const TArg& o) {
    t = o.t;
    std::memcpy(shape, o.shape, sizeof(shape));
    std::memcpy(strides, o.strides, sizeof(strides));
    present = o.present;
    has_shape = o.has_shape;
    has_strides = o.has_strides;
    return *this;
  }
  DLTensor* get() {
    if (!present) return nullptr;
    t.shape = has_shape ? shape : nullptr;
    t.strides = has_strides ? strides : nullptr;
    return &t;
  }
  void set_shape(std::vector<int64_t> s) {
    t.ndim = int(s.size());
    for (size_t i = 0; i < s.size(); ++i) shape[i] = s[i];
  }
  void set_strides(std::vector<int64_t> s) {
    has_strides = true;
    for (size_t i = 0; i < s.size(); ++i) strides[i] = s[i];
  }
  void compact_strides() {  // explicit compact strides, to edit one of them
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      strides[i] = s;
      s *= shape[i];
    }
    has_strides = true;
  }
  void to_cuda() { t.device = DLDevice{kDLCUDA, 0}; }
};

constexpr DLDevice kVulkan{kDLVulkan, 0};

// ---- kf_mla_decode --------------------------------------------------------------------------

struct DecodeCall {
  TArg q, kv, bt, sl, md, out, lse, ws, eb;
  kf_kv_format fmt = KF_KV_BF16;
  float scale = kScaleV2Lite;
  kf_status call() {
    return kf_mla_decode(q.get(), kv.get(), fmt, bt.get(), sl.get(), md.get(), scale, out.get(),
                         lse.get(), ws.get(), eb.get(), nullptr);
  }
};

class DecodeErrorFixture {
 public:
  DecodeErrorFixture() {
    auto rng = test_rng();
    Problem pr;
    pr.batch = 2;
    pr.s_q = 2;
    pr.h_q = 16;
    pr.page_size = 16;
    pr.num_workers = 3;
    pr.seqlens = {37, 100};
    b = build_problem(pr, rng);
    eb = HostTensor(kI32, {4});
    eb.ptr<int32_t>()[1] = -1;
    cache8 = HostTensor(kU8, {b.num_pages, 16, 644});
    c.q = TArg(b.q_t.dl());
    c.kv = TArg(b.cache.dl());
    c.bt = TArg(b.block_table.dl());
    c.sl = TArg(b.cache_seqlens.dl());
    c.md = TArg(b.metadata.dl());
    c.out = TArg(b.out.dl());
    c.lse = TArg(b.lse.dl());
    c.ws = TArg(b.workspace.dl());
    c.eb = TArg(eb.dl());
  }
  Built b;
  HostTensor eb, cache8, extra;
  DecodeCall c;
};

struct DecodeErrorCase {
  const char* name;
  std::function<void(DecodeErrorFixture&)> breaks;
  kf_status status;
  const char* message;  // a substring of kf_last_error()
};
void PrintTo(const DecodeErrorCase& c, std::ostream* os) { *os << c.name; }

// Rebuild the metadata into the fixture's buffer for other call parameters (same size).
void remake_metadata(DecodeErrorFixture& f, std::vector<int32_t> seqlens, int h_q, int s_q) {
  HostTensor sl(kI32, {int64_t(seqlens.size())});
  std::copy(seqlens.begin(), seqlens.end(), sl.ptr<int32_t>());
  const int64_t n = f.b.metadata.numel();
  const int W = int((n - 17 - int64_t(seqlens.size())) / 8);
  ASSERT_EQ(kf_mla_metadata_for_format(sl.dl(), h_q, s_q, W, KF_KV_BF16, f.b.metadata.dl(), nullptr),
            KF_SUCCESS)
      << kf_last_error();
}

void use_cache8(DecodeErrorFixture& f, kf_kv_format fmt) {
  f.c.fmt = fmt;
  f.c.kv = TArg(f.cache8.dl());
}

const kf_status kBad = KF_ERROR_INVALID_ARGUMENT;

std::vector<DecodeErrorCase> decode_error_cases() {
  using F = DecodeErrorFixture;
  std::vector<DecodeErrorCase> v = {
      {"NullQ", [](F& f) { f.c.q.present = false; }, kBad, "q: expected a tensor, got NULL"},
      {"NullKvCache", [](F& f) { f.c.kv.present = false; }, kBad, "kv_cache: expected a tensor"},
      {"NullBlockTable", [](F& f) { f.c.bt.present = false; }, kBad, "block_table: expected a tensor"},
      {"NullCacheSeqlens", [](F& f) { f.c.sl.present = false; }, kBad, "cache_seqlens: expected a tensor"},
      {"NullMetadata", [](F& f) { f.c.md.present = false; }, kBad, "metadata: expected a tensor"},
      {"NullOut", [](F& f) { f.c.out.present = false; }, kBad, "out: expected a tensor"},
      {"NullLse", [](F& f) { f.c.lse.present = false; }, kBad, "lse: expected a tensor"},
      {"NullShape", [](F& f) { f.c.q.has_shape = false; }, kBad, "q: expected a shape"},
      {"NullData", [](F& f) { f.c.out.t.data = nullptr; }, kBad, "out: expected a data pointer"},
      {"NegativeStride", [](F& f) { f.c.q.compact_strides(); f.c.q.strides[0] = -9216; }, kBad,
       "q: expected non-negative strides"},
      {"TwoLanes", [](F& f) { f.c.q.t.dtype.lanes = 2; }, kBad, "q: expected one lane"},
      {"QDtypeInt32", [](F& f) { f.c.q.t.dtype = kI32; }, kBad,
       "q: expected dtype bfloat16 or float16, got int32"},
      {"QDtypeFloat32", [](F& f) { f.c.q.t.dtype = kF32; }, kBad, "got float32"},
      {"QNdim3", [](F& f) { f.c.q.set_shape({2, 32, 576}); }, kBad, "q: expected 4 dimensions"},
      {"QHeadDim512", [](F& f) { f.c.q.shape[3] = 512; }, kBad, "q: expected shape[3] (head dim"},
      {"QHq129", [](F& f) { f.c.q.shape[2] = 129; }, kBad, "(h_q) in 1..128, got 129"},
      {"QHq0", [](F& f) { f.c.q.shape[2] = 0; }, kBad, "(h_q) in 1..128, got 0"},
      {"QSq17", [](F& f) { f.c.q.shape[1] = 17; }, kBad, "(s_q) in 1..16, got 17"},
      {"QBatch0", [](F& f) { f.c.q.shape[0] = 0; }, kBad, "q: expected shape[0] (batch) in 1.."},
      {"QLastDimStrided", [](F& f) { f.c.q.compact_strides(); f.c.q.strides[3] = 2; }, kBad,
       "q: expected the last dimension contiguous"},
      {"QHeadStride580", [](F& f) { f.c.q.compact_strides(); f.c.q.strides[2] = 580; }, kBad,
       "q: expected stride[2] a multiple of 8"},
      {"QMisaligned", [](F& f) { f.c.q.t.byte_offset = 2; }, kBad,
       "q: expected data + byte_offset 16-byte aligned"},
      {"KvFormatOutOfRange", [](F& f) { f.c.fmt = kf_kv_format(7); }, kBad,
       "kv_format: expected KF_KV_BF16"},
      {"KvFormatFp16WithBf16Q", [](F& f) { f.c.fmt = KF_KV_FP16; }, kBad,
       "kv_format: KF_KV_FP16 needs q of dtype float16, got bfloat16"},
      {"CacheDtypeMismatch", [](F& f) { f.c.kv.t.dtype = kF16; }, kBad,
       "kv_cache: expected dtype bfloat16 for kv_format KF_KV_BF16, got float16"},
      {"CacheNdim2", [](F& f) { f.c.kv.set_shape({16, 576}); }, kBad, "kv_cache: expected 3 dimensions"},
      {"Cache4dTwoHeads", [](F& f) { f.c.kv.set_shape({4, 16, 2, 288}); }, kBad,
       "kv_cache: expected shape[2] (kv heads) = 1"},
      {"CacheHeadDim512", [](F& f) { f.c.kv.shape[2] = 512; }, kBad, "kv_cache: expected shape[2] (head dim"},
      {"CachePageSize3", [](F& f) { f.c.kv.shape[1] = 3; }, kBad,
       "kv_cache: shape[1] (page_size): expected a power of two in 1..256, got 3"},
      {"CachePageSize512", [](F& f) { f.c.kv.shape[1] = 512; }, kBad, "power of two in 1..256, got 512"},
      {"CacheZeroPages", [](F& f) { f.c.kv.shape[0] = 0; }, kBad, "kv_cache: expected shape[0] (num_pages) in 1.."},
      {"CacheTokenStride580", [](F& f) { f.c.kv.compact_strides(); f.c.kv.strides[1] = 580; }, kBad,
       "kv_cache: expected stride[1] a multiple of 8"},
      {"CacheLastDimStrided", [](F& f) { f.c.kv.compact_strides(); f.c.kv.strides[2] = 2; }, kBad,
       "kv_cache: expected the last dimension contiguous"},
      {"CacheMisaligned", [](F& f) { f.c.kv.t.byte_offset = 8; }, kBad,
       "kv_cache: expected data + byte_offset 16-byte aligned"},
      {"BlockTableInt64", [](F& f) { f.c.bt.t.dtype = kI64; }, kBad,
       "block_table: expected dtype int32, got int64"},
      {"BlockTableBatchMismatch", [](F& f) { f.c.bt.shape[0] = 3; }, kBad,
       "block_table: expected shape[0] (batch (of q)) = 2, got 3"},
      {"BlockTableNdim1", [](F& f) { f.c.bt.set_shape({8}); }, kBad, "block_table: expected 2 dimensions"},
      {"BlockTableLastDimStrided", [](F& f) { f.c.bt.compact_strides(); f.c.bt.strides[1] = 2; }, kBad,
       "block_table: expected the last dimension contiguous"},
      {"BlockTableTooWide", [](F& f) { f.c.bt.shape[1] = int64_t(1) << 28; f.c.bt.set_strides({1 << 28, 1}); },
       kBad, "max_pages_per_seq * page_size <= 2^31 - 1"},
      {"SeqlensInt64", [](F& f) { f.c.sl.t.dtype = kI64; }, kBad, "cache_seqlens: expected dtype int32"},
      {"SeqlensBatchMismatch", [](F& f) { f.c.sl.shape[0] = 1; }, kBad,
       "cache_seqlens: expected shape[0] (batch (of q)) = 2, got 1"},
      {"SeqlensNdim2", [](F& f) { f.c.sl.set_shape({2, 1}); }, kBad, "cache_seqlens: expected 1 dimensions"},
      {"SeqlensStrided", [](F& f) { f.c.sl.set_strides({2}); }, kBad, "cache_seqlens: expected a compact"},
      {"MetadataFloat32", [](F& f) { f.c.md.t.dtype = kF32; }, kBad, "metadata: expected dtype int32"},
      {"MetadataSizeOffByOne", [](F& f) { f.c.md.shape[0] -= 1; }, kBad,
       "metadata: expected kf_mla_metadata_size(batch=2, num_workers) = 19 + 8 * num_workers"},
      {"MetadataNoWorkers", [](F& f) { f.c.md.shape[0] = 19; }, kBad, "metadata: expected kf_mla_metadata_size"},
      {"OutDtypeMismatch", [](F& f) { f.c.out.t.dtype = kF16; }, kBad,
       "out: expected dtype bfloat16 (the dtype of q), got float16"},
      {"OutLatentDim576", [](F& f) { f.c.out.shape[3] = 576; }, kBad, "out: expected shape[3] (latent dim) = 512"},
      {"OutBatchMismatch", [](F& f) { f.c.out.shape[0] = 1; }, kBad, "out: expected shape[0] (batch (of q)) = 2"},
      {"OutSqMismatch", [](F& f) { f.c.out.shape[1] = 1; }, kBad, "out: expected shape[1] (s_q (of q)) = 2"},
      {"OutHqMismatch", [](F& f) { f.c.out.shape[2] = 8; }, kBad, "out: expected shape[2] (h_q (of q)) = 16"},
      {"OutNdim3", [](F& f) { f.c.out.set_shape({2, 32, 512}); }, kBad, "out: expected 4 dimensions"},
      {"OutLastDimStrided", [](F& f) { f.c.out.compact_strides(); f.c.out.strides[3] = 2; }, kBad,
       "out: expected the last dimension contiguous"},
      {"OutHeadStride516", [](F& f) { f.c.out.compact_strides(); f.c.out.strides[2] = 516; }, kBad,
       "out: expected stride[2] a multiple of 8"},
      {"OutOverlappingRows", [](F& f) { f.c.out.compact_strides(); f.c.out.strides[2] = 0; }, kBad,
       "out: expected strides that do not overlap"},
      {"OutMisaligned", [](F& f) { f.c.out.t.byte_offset = 4; }, kBad,
       "out: expected data + byte_offset 16-byte aligned"},
      {"LseFloat16", [](F& f) { f.c.lse.t.dtype = kF16; }, kBad, "lse: expected dtype float32, got float16"},
      {"LseTransposed", [](F& f) { f.c.lse.set_shape({2, 2, 16}); }, kBad,
       "lse: expected shape[1] (h_q (of q)) = 16, got 2"},
      {"LseNotCompact", [](F& f) { f.c.lse.set_strides({64, 2, 1}); }, kBad, "lse: expected a compact"},
      {"LseNdim2", [](F& f) { f.c.lse.set_shape({2, 32}); }, kBad, "lse: expected 3 dimensions"},
      {"WorkspaceNull", [](F& f) { f.c.ws.present = false; }, kBad, "workspace: expected at least"},
      {"WorkspaceTooSmall", [](F& f) { f.c.ws.shape[0] -= 1; }, kBad, "workspace: expected at least"},
      {"WorkspaceMisaligned",
       [](F& f) {
         f.extra = HostTensor(kU8, {f.c.ws.shape[0] + 512});
         f.c.ws = TArg(f.extra.dl());
         f.c.ws.t.byte_offset = 16;
       },
       kBad, "workspace: expected data + byte_offset 256-byte aligned"},
      {"WorkspaceStrided", [](F& f) { f.c.ws.set_strides({2}); }, kBad, "workspace: expected a compact"},
      {"ErrorBufferTooShort", [](F& f) { f.c.eb.shape[0] = 3; }, kBad,
       "error_buffer: expected shape[0] (length) in 4.."},
      {"ErrorBufferInt64", [](F& f) { f.c.eb.t.dtype = kI64; }, kBad, "error_buffer: expected dtype int32"},
      {"DeviceMismatchOut", [](F& f) { f.c.out.to_cuda(); }, kBad,
       "out: expected device cpu (the device of q), got cuda:0"},
      {"DeviceMismatchCache", [](F& f) { f.c.kv.to_cuda(); }, kBad, "kv_cache: expected device cpu"},
      {"DeviceMismatchErrorBuffer", [](F& f) { f.c.eb.to_cuda(); }, kBad, "error_buffer: expected device cpu"},
      {"DeviceMismatchWorkspace", [](F& f) { f.c.ws.to_cuda(); }, kBad, "workspace: expected device cpu"},
      // Two GPUs: every tensor on cuda:0 but out naming cuda:1 (which need not exist).
      {"DeviceIdMismatchOut",
       [](F& f) {
         for (TArg* t : {&f.c.q, &f.c.kv, &f.c.bt, &f.c.sl, &f.c.md, &f.c.out, &f.c.lse, &f.c.ws, &f.c.eb})
           t->to_cuda();
         f.c.out.t.device.device_id = 1;
       },
       kBad, "out: expected device cuda:0 (the device of q), got cuda:1"},
      {"UnknownDeviceType",
       [](F& f) {
         for (TArg* t : {&f.c.q, &f.c.kv, &f.c.bt, &f.c.sl, &f.c.md, &f.c.out, &f.c.lse, &f.c.ws, &f.c.eb})
           t->t.device = kVulkan;
       },
       KF_ERROR_UNSUPPORTED, "q: expected a cpu or cuda tensor, got device device_type 7"},
      {"ScaleNaN", [](F& f) { f.c.scale = NAN; }, kBad, "softmax_scale: expected a finite value"},
      {"ScaleInf", [](F& f) { f.c.scale = INFINITY; }, kBad, "softmax_scale: expected a finite value"},
      // contents of CPU tensors
      {"SeqlenNegative", [](F& f) { f.b.cache_seqlens.ptr<int32_t>()[1] = -3; }, kBad,
       "cache_seqlens[1] = -3: expected 0.."},
      {"SeqlenBeyondBlockTable",
       [](F& f) { f.b.cache_seqlens.ptr<int32_t>()[0] = int32_t(f.b.max_pages * 16 + 1); }, kBad,
       "cache_seqlens[0] ="},
      {"BlockTableEntryTooLarge",
       [](F& f) { f.b.block_table.ptr<int32_t>()[f.b.max_pages] = f.b.num_pages; }, kBad,
       "block_table[1, 0] ="},
      {"BlockTableEntryNegative", [](F& f) { f.b.block_table.ptr<int32_t>()[1] = -1; }, kBad,
       "block_table[0, 1] = -1: expected a page index in [0, "},
      {"MetadataBadMagic", [](F& f) { f.b.metadata.ptr<int32_t>()[0] = 0; }, kBad,
       "metadata: expected magic 0x4B464D44"},
      {"MetadataOtherHq", [](F& f) { remake_metadata(f, {37, 100}, 8, 2); }, kBad,
       "metadata: expected h_q 16 (of this call), got 8"},
      {"MetadataOtherSq", [](F& f) { remake_metadata(f, {37, 100}, 16, 1); }, kBad,
       "metadata: expected s_q 2 (of this call), got 1"},
      {"MetadataOtherBatch",
       [](F& f) { remake_metadata(f, std::vector<int32_t>(10, 50), 16, 2); },  // same size: 10 + 8*2
       kBad, "metadata: expected batch 2 (of this call), got 10"},
      {"MetadataOtherWorkers", [](F& f) { f.b.metadata.ptr<int32_t>()[5] = 4; }, kBad,
       "metadata: expected num_workers 3 (of this call), got 4"},
      {"MetadataOtherLengths", [](F& f) { remake_metadata(f, {37, 2000}, 16, 2); }, kBad,
       "metadata: does not match cache_seqlens"},
      {"MetadataFixedCostOutOfRange", [](F& f) { f.b.metadata.ptr<int32_t>()[8] = 1000; }, kBad,
       "metadata: fixed cost 1000 out of range 0..64"},
      // 8-bit formats
      {"Fp8CacheBf16", [](F& f) { f.c.fmt = KF_KV_FP8_E4M3; }, kBad,
       "kv_cache: expected dtype uint8 for kv_format KF_KV_FP8_E4M3, got bfloat16"},
      {"Int8CacheRow576", [](F& f) { use_cache8(f, KF_KV_INT8); f.c.kv.shape[2] = 576; }, kBad,
       "kv_cache: expected shape[2] (bytes per token) = 644"},
      {"Fp8PageSize8", [](F& f) { use_cache8(f, KF_KV_FP8_E4M3); f.c.kv.shape[1] = 8; }, kBad,
       "expected a multiple of 16 for KF_KV_FP8_E4M3"},
      {"Fp8PageNotCompact",
       [](F& f) { use_cache8(f, KF_KV_FP8_E4M3); f.c.kv.compact_strides(); f.c.kv.strides[1] = 648; }, kBad,
       "kv_cache: expected a compact page (stride[1] = 644 bytes)"},
      {"Int8PagesOverlap",
       [](F& f) { use_cache8(f, KF_KV_INT8); f.c.kv.compact_strides(); f.c.kv.strides[0] = 644 * 16 - 16; }, kBad,
       "pages must not overlap"},
      {"Fp8PageStrideMisaligned",
       [](F& f) { use_cache8(f, KF_KV_FP8_E4M3); f.c.kv.compact_strides(); f.c.kv.strides[0] = 644 * 16 + 4; }, kBad,
       "kv_cache: expected stride[0] a multiple of 16"},
      {"Int8CacheMisaligned", [](F& f) { use_cache8(f, KF_KV_INT8); f.c.kv.t.byte_offset = 4; }, kBad,
       "kv_cache: expected data + byte_offset 16-byte aligned"},
  };
#if !KF_TESTS_WITH_CUDA
  v.push_back({"AllOnCudaWithoutCuda",
               [](F& f) {
                 for (TArg* t : {&f.c.q, &f.c.kv, &f.c.bt, &f.c.sl, &f.c.md, &f.c.out, &f.c.lse, &f.c.ws, &f.c.eb})
                   t->to_cuda();
               },
               KF_ERROR_UNSUPPORTED, "built without CUDA"});
#endif
  return v;
}

class DecodeErrors : public ::testing::TestWithParam<DecodeErrorCase> {};

TEST_P(DecodeErrors, RejectedWithMessageAndNothingWritten) {
  DecodeErrorFixture f;
  ASSERT_EQ(f.c.call(), KF_SUCCESS) << "the unbroken call must succeed: " << kf_last_error();
  EXPECT_STREQ(kf_last_error(), "");
  f.b.out.fill<uint16_t>(0x7fc1);
  f.b.lse.fill<float>(-7.f);
  const auto out0 = f.b.out.snapshot(), lse0 = f.b.lse.snapshot();
  GetParam().breaks(f);
  const kf_status s = f.c.call();
  EXPECT_EQ(s, GetParam().status) << kf_last_error();
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
  EXPECT_EQ(out0, f.b.out.snapshot()) << "out written by a rejected call";
  EXPECT_EQ(lse0, f.b.lse.snapshot()) << "lse written by a rejected call";
}

INSTANTIATE_TEST_SUITE_P(Arg, DecodeErrors, ::testing::ValuesIn(decode_error_cases()),
                         [](const ::testing::TestParamInfo<DecodeErrorCase>& i) { return std::string(i.param.name); });

// ---- kf_mla_metadata_for_format ---------------------------------------------------------------

struct MetadataCall {
  TArg sl, md;
  int h_q = 16, s_q = 1, W = 3;
  kf_kv_format fmt = KF_KV_FP8_E4M3;
  kf_status call() {
    return kf_mla_metadata_for_format(sl.get(), h_q, s_q, W, fmt, md.get(), nullptr);
  }
};
struct MetadataFixture {
  MetadataFixture() : sl(kI32, {3}), md(kI32, {16 + 24 + 4}) {
    sl.ptr<int32_t>()[0] = 5;
    sl.ptr<int32_t>()[1] = 0;
    sl.ptr<int32_t>()[2] = 700;
    c.sl = TArg(sl.dl());
    c.md = TArg(md.dl());
  }
  HostTensor sl, md;
  MetadataCall c;
};
struct MetadataErrorCase {
  const char* name;
  std::function<void(MetadataFixture&)> breaks;
  kf_status status;
  const char* message;
};
void PrintTo(const MetadataErrorCase& c, std::ostream* os) { *os << c.name; }

std::vector<MetadataErrorCase> metadata_error_cases() {
  using F = MetadataFixture;
  return {
      {"NullSeqlens", [](F& f) { f.c.sl.present = false; }, kBad, "cache_seqlens: expected a tensor"},
      {"NullMetadata", [](F& f) { f.c.md.present = false; }, kBad, "metadata: expected a tensor"},
      {"SeqlensInt64", [](F& f) { f.c.sl.t.dtype = kI64; }, kBad, "cache_seqlens: expected dtype int32"},
      {"SeqlensNdim2", [](F& f) { f.c.sl.set_shape({3, 1}); }, kBad, "cache_seqlens: expected 1 dimensions"},
      {"SeqlensEmpty", [](F& f) { f.c.sl.shape[0] = 0; }, kBad, "cache_seqlens: expected shape[0] (batch) in 1.."},
      {"SeqlensStrided", [](F& f) { f.c.sl.set_strides({2}); f.c.sl.shape[0] = 2; f.c.md.shape[0] = 43; }, kBad,
       "cache_seqlens: expected a compact"},
      {"Hq0", [](F& f) { f.c.h_q = 0; }, kBad, "h_q: expected 1..128, got 0"},
      {"Hq129", [](F& f) { f.c.h_q = 129; }, kBad, "h_q: expected 1..128, got 129"},
      {"Sq0", [](F& f) { f.c.s_q = 0; }, kBad, "s_q: expected 1..16, got 0"},
      {"Sq17", [](F& f) { f.c.s_q = 17; }, kBad, "s_q: expected 1..16, got 17"},
      {"Workers0", [](F& f) { f.c.W = 0; }, kBad, "num_workers: expected 1..65536, got 0"},
      {"WorkersTooMany", [](F& f) { f.c.W = 70000; }, kBad, "num_workers: expected 1..65536, got 70000"},
      {"MetadataWrongSize", [](F& f) { f.c.W = 4; }, kBad,
       "metadata: expected kf_mla_metadata_size(batch=3, num_workers=4) = 52 int32 elements, got 44"},
      {"MetadataFloat32", [](F& f) { f.c.md.t.dtype = kF32; }, kBad, "metadata: expected dtype int32"},
      {"MetadataStrided", [](F& f) { f.c.md.set_strides({2}); f.c.md.shape[0] = 44; }, kBad,
       "metadata: expected a compact"},
      {"MetadataMisaligned", [](F& f) { f.c.md.t.byte_offset = 2; }, kBad, "metadata: expected data + byte_offset 4-byte"},
      {"DeviceMismatch", [](F& f) { f.c.md.to_cuda(); }, kBad, "metadata: expected device cpu"},
      {"UnknownDevice", [](F& f) { f.c.sl.t.device = kVulkan; f.c.md.t.device = kVulkan; }, KF_ERROR_UNSUPPORTED,
       "cache_seqlens: expected a cpu or cuda tensor"},
      {"NegativeSeqlen", [](F& f) { f.sl.ptr<int32_t>()[2] = -1; }, kBad, "cache_seqlens[2] = -1: expected >= 0"},
      {"UnknownFormat", [](F& f) { f.c.fmt = kf_kv_format(4); }, kBad,
       "kv_format: expected KF_KV_BF16, KF_KV_FP16, KF_KV_FP8_E4M3 or KF_KV_INT8 (0..3), got 4"},
  };
}

class MetadataErrors : public ::testing::TestWithParam<MetadataErrorCase> {};

TEST_P(MetadataErrors, RejectedWithMessageAndNothingWritten) {
  MetadataFixture f;
  ASSERT_EQ(f.c.call(), KF_SUCCESS) << kf_last_error();
  f.md.fill<int32_t>(-99);
  GetParam().breaks(f);
  EXPECT_EQ(f.c.call(), GetParam().status) << kf_last_error();
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
  for (int64_t i = 0; i < f.md.numel(); ++i) ASSERT_EQ(f.md.ptr<int32_t>()[i], -99) << i;
}

INSTANTIATE_TEST_SUITE_P(Arg, MetadataErrors, ::testing::ValuesIn(metadata_error_cases()),
                         [](const ::testing::TestParamInfo<MetadataErrorCase>& i) { return std::string(i.param.name); });

// ---- kf_cache_append --------------------------------------------------------------------------

struct AppendCall {
  TArg kv, cache, slots, eb;
  kf_kv_format fmt = KF_KV_BF16;
  kf_status call() { return kf_cache_append(kv.get(), cache.get(), fmt, slots.get(), eb.get(), nullptr); }
};
struct AppendFixture {
  AppendFixture()
      : kv(kBF16, {3, 576}), cache(kBF16, {4, 16, 576}), cache8(kU8, {4, 16, 644}), slots(kI64, {3}), eb(kI32, {4}) {
    slots.ptr<int64_t>()[0] = 5;
    slots.ptr<int64_t>()[1] = -1;
    slots.ptr<int64_t>()[2] = 63;
    eb.ptr<int32_t>()[1] = -1;
    c.kv = TArg(kv.dl());
    c.cache = TArg(cache.dl());
    c.slots = TArg(slots.dl());
    c.eb = TArg(eb.dl());
  }
  HostTensor kv, cache, cache8, slots, eb;
  AppendCall c;
};
struct AppendErrorCase {
  const char* name;
  std::function<void(AppendFixture&)> breaks;
  kf_status status;
  const char* message;
};
void PrintTo(const AppendErrorCase& c, std::ostream* os) { *os << c.name; }

std::vector<AppendErrorCase> append_error_cases() {
  using F = AppendFixture;
  return {
      {"NullKv", [](F& f) { f.c.kv.present = false; }, kBad, "kv: expected a tensor"},
      {"NullCache", [](F& f) { f.c.cache.present = false; }, kBad, "kv_cache: expected a tensor"},
      {"NullSlotMapping", [](F& f) { f.c.slots.present = false; }, kBad, "slot_mapping: expected a tensor"},
      {"KvFloat32", [](F& f) { f.c.kv.t.dtype = kF32; }, kBad, "kv: expected dtype bfloat16 or float16, got float32"},
      {"KvNdim1", [](F& f) { f.c.kv.set_shape({1728}); }, kBad, "kv: expected 2 dimensions [n, 576]"},
      {"KvHeadDim512", [](F& f) { f.c.kv.shape[1] = 512; }, kBad, "kv: expected shape[1] (head dim"},
      {"KvLastDimStrided", [](F& f) { f.c.kv.compact_strides(); f.c.kv.strides[1] = 2; }, kBad,
       "kv: expected the last dimension contiguous"},
      {"KvRowStride580", [](F& f) { f.c.kv.compact_strides(); f.c.kv.strides[0] = 580; }, kBad,
       "kv: expected stride[0] a multiple of 8"},
      {"KvMisaligned", [](F& f) { f.c.kv.t.byte_offset = 2; }, kBad, "kv: expected data + byte_offset 16-byte aligned"},
      {"FormatOutOfRange", [](F& f) { f.c.fmt = kf_kv_format(-1); }, kBad, "kv_format: expected"},
      {"FormatFp16WithBf16Kv", [](F& f) { f.c.fmt = KF_KV_FP16; }, kBad,
       "kv_format: KF_KV_FP16 needs kv of dtype float16, got bfloat16"},
      {"CacheDtypeMismatch", [](F& f) { f.c.cache.t.dtype = kF16; }, kBad,
       "kv_cache: expected dtype bfloat16 for kv_format KF_KV_BF16, got float16"},
      {"CachePageSize5", [](F& f) { f.c.cache.shape[1] = 5; }, kBad, "power of two in 1..256, got 5"},
      {"CachePagesOverlap", [](F& f) { f.c.cache.compact_strides(); f.c.cache.strides[0] = 576; }, kBad,
       "kv_cache: expected strides that do not overlap"},
      {"SlotMappingInt32", [](F& f) { f.c.slots.t.dtype = kI32; }, kBad, "slot_mapping: expected dtype int64, got int32"},
      {"SlotMappingLength", [](F& f) { f.c.slots.shape[0] = 2; }, kBad,
       "slot_mapping: expected shape[0] (n (rows of kv)) = 3, got 2"},
      {"SlotMappingStrided", [](F& f) { f.c.slots.set_strides({2}); f.c.slots.shape[0] = 2; f.c.kv.shape[0] = 2; }, kBad,
       "slot_mapping: expected a compact"},
      {"SlotBeyondCache", [](F& f) { f.slots.ptr<int64_t>()[2] = 64; }, kBad,
       "slot_mapping[2] = 64: expected < 64 (num_pages 4 * page_size 16)"},
      {"DeviceMismatch", [](F& f) { f.c.slots.to_cuda(); }, kBad, "slot_mapping: expected device cpu (the device of kv)"},
      {"ErrorBufferTooShort", [](F& f) { f.c.eb.shape[0] = 2; }, kBad, "error_buffer: expected shape[0] (length) in 4.."},
      {"Fp8CacheBf16", [](F& f) { f.c.fmt = KF_KV_FP8_E4M3; }, kBad, "kv_cache: expected dtype uint8"},
      {"Int8PageSize8",
       [](F& f) { f.c.fmt = KF_KV_INT8; f.c.cache = TArg(f.cache8.dl()); f.c.cache.shape[1] = 8; }, kBad,
       "expected a multiple of 16 for KF_KV_INT8"},
  };
}

class AppendErrors : public ::testing::TestWithParam<AppendErrorCase> {};

TEST_P(AppendErrors, RejectedWithMessageAndNothingWritten) {
  AppendFixture f;
  ASSERT_EQ(f.c.call(), KF_SUCCESS) << kf_last_error();
  f.cache.fill<uint16_t>(0x7fc0);
  const auto cache0 = f.cache.snapshot();
  GetParam().breaks(f);
  EXPECT_EQ(f.c.call(), GetParam().status) << kf_last_error();
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
  EXPECT_EQ(cache0, f.cache.snapshot()) << "cache written by a rejected call";
}

INSTANTIATE_TEST_SUITE_P(Arg, AppendErrors, ::testing::ValuesIn(append_error_cases()),
                         [](const ::testing::TestParamInfo<AppendErrorCase>& i) { return std::string(i.param.name); });

// ---- size queries -------------------------------------------------------------------------------

struct SizeErrorCase {
  const char* name;
  std::function<kf_status()> call;
  kf_status status;
  const char* message;
};
void PrintTo(const SizeErrorCase& c, std::ostream* os) { *os << c.name; }

std::vector<SizeErrorCase> size_error_cases() {
  static size_t n;
  static int w;
  std::vector<SizeErrorCase> v = {
      {"BytesPerTokenBadFormat", [] { return kf_cache_bytes_per_token(kf_kv_format(4), &n); }, kBad, "kv_format: expected"},
      {"BytesPerTokenNullResult", [] { return kf_cache_bytes_per_token(KF_KV_BF16, nullptr); }, kBad, "bytes: expected a pointer"},
      {"BytesPerPageBadFormat", [] { return kf_cache_bytes_per_page(kf_kv_format(9), 16, &n); }, kBad, "kv_format: expected"},
      {"BytesPerPageSize0", [] { return kf_cache_bytes_per_page(KF_KV_BF16, 0, &n); }, kBad, "page_size: expected a power of two in 1..256, got 0"},
      {"BytesPerPageSize3", [] { return kf_cache_bytes_per_page(KF_KV_FP16, 3, &n); }, kBad, "page_size: expected a power of two in 1..256, got 3"},
      {"BytesPerPageSize512", [] { return kf_cache_bytes_per_page(KF_KV_BF16, 512, &n); }, kBad, "got 512"},
      {"BytesPerPageFp8Size8", [] { return kf_cache_bytes_per_page(KF_KV_FP8_E4M3, 8, &n); }, kBad, "page_size: expected a multiple of 16"},
      {"BytesPerPageNullResult", [] { return kf_cache_bytes_per_page(KF_KV_INT8, 16, nullptr); }, kBad, "bytes: expected a pointer"},
      {"MetadataSizeBatch0", [] { return kf_mla_metadata_size(0, 4, &n); }, kBad, "batch: expected 1..1048576, got 0"},
      {"MetadataSizeWorkers0", [] { return kf_mla_metadata_size(4, 0, &n); }, kBad, "num_workers: expected 1..65536, got 0"},
      {"MetadataSizeNullResult", [] { return kf_mla_metadata_size(4, 4, nullptr); }, kBad, "num_elements: expected a pointer"},
      {"WorkspaceSizeBatchNegative", [] { return kf_mla_workspace_size(-1, 16, 1, 4, &n); }, kBad, "batch: expected 1.."},
      {"WorkspaceSizeHq0", [] { return kf_mla_workspace_size(2, 0, 1, 4, &n); }, kBad, "h_q: expected 1..128, got 0"},
      {"WorkspaceSizeSq17", [] { return kf_mla_workspace_size(2, 16, 17, 4, &n); }, kBad, "s_q: expected 1..16, got 17"},
      {"WorkspaceSizeWorkers0", [] { return kf_mla_workspace_size(2, 16, 1, 0, &n); }, kBad, "num_workers: expected 1.."},
      {"WorkspaceSizeNullResult", [] { return kf_mla_workspace_size(2, 16, 1, 4, nullptr); }, kBad, "bytes: expected a pointer"},
      {"DefaultWorkersDeviceMinus2", [] { return kf_mla_default_num_workers_for_format(-2, 16, 1, KF_KV_BF16, &w); }, kBad,
       "device_id: expected -1 (CPU) or a CUDA device id >= 0, got -2"},
      {"DefaultWorkersHq200", [] { return kf_mla_default_num_workers_for_format(-1, 200, 1, KF_KV_BF16, &w); }, kBad, "h_q: expected 1..128, got 200"},
      {"DefaultWorkersSq0", [] { return kf_mla_default_num_workers_for_format(-1, 16, 0, KF_KV_BF16, &w); }, kBad, "s_q: expected 1..16, got 0"},
      {"DefaultWorkersNullResult", [] { return kf_mla_default_num_workers_for_format(-1, 16, 1, KF_KV_BF16, nullptr); }, kBad, "num_workers: expected a pointer"},
      {"DefaultWorkersFormat7", [] { return kf_mla_default_num_workers_for_format(-1, 16, 1, kf_kv_format(7), &w); }, kBad,
       "kv_format: expected KF_KV_BF16, KF_KV_FP16, KF_KV_FP8_E4M3 or KF_KV_INT8 (0..3), got 7"},
      {"DefaultWorkersForBatch0", [] { return kf_mla_default_num_workers_for_batch(-1, 16, 1, KF_KV_FP8_E4M3, 0, &w); }, kBad,
       "batch: expected"},
      {"DefaultWorkersForBatchHq0", [] { return kf_mla_default_num_workers_for_batch(-1, 0, 1, KF_KV_FP8_E4M3, 8, &w); }, kBad,
       "h_q: expected 1..128, got 0"},
      {"DefaultWorkersFormatHq0", [] { return kf_mla_default_num_workers_for_format(-1, 0, 1, KF_KV_INT8, &w); }, kBad, "h_q: expected 1..128, got 0"},
  };
#if !KF_TESTS_WITH_CUDA
  v.push_back({"DefaultWorkersCudaWithoutCuda", [] { return kf_mla_default_num_workers_for_format(0, 16, 1, KF_KV_BF16, &w); },
               KF_ERROR_UNSUPPORTED, "built without CUDA"});
#endif
  return v;
}

class SizeErrors : public ::testing::TestWithParam<SizeErrorCase> {};

TEST_P(SizeErrors, RejectedWithMessage) {
  EXPECT_EQ(GetParam().call(), GetParam().status) << kf_last_error();
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
}

INSTANTIATE_TEST_SUITE_P(Arg, SizeErrors, ::testing::ValuesIn(size_error_cases()),
                         [](const ::testing::TestParamInfo<SizeErrorCase>& i) { return std::string(i.param.name); });

// KF_KERNEL_FAMILY is read at every CUDA call, not once per process: changing it between calls
// changes the answer (the GPU tests switch families this way). The value before the test comes
// back at its end.
TEST(KernelFamilyEnv, ReadAtEveryCall) {
  if (kf_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const char* env = std::getenv("KF_KERNEL_FAMILY");
  const std::string before = env == nullptr ? "" : env;
  int w = 0;
  setenv("KF_KERNEL_FAMILY", "sm75", 1);
  EXPECT_EQ(kf_mla_default_num_workers_for_format(0, 16, 1, KF_KV_BF16, &w),
            KF_ERROR_INVALID_ARGUMENT);
  setenv("KF_KERNEL_FAMILY", "sm80", 1);
  EXPECT_EQ(kf_mla_default_num_workers_for_format(0, 16, 1, KF_KV_BF16, &w), KF_SUCCESS)
      << kf_last_error();
  unsetenv("KF_KERNEL_FAMILY");
  EXPECT_EQ(kf_mla_default_num_workers_for_format(0, 128, 1, KF_KV_BF16, &w), KF_SUCCESS)
      << kf_last_error();
  if (before.empty())
    unsetenv("KF_KERNEL_FAMILY");
  else
    setenv("KF_KERNEL_FAMILY", before.c_str(), 1);
}

// KF_KERNEL_FAMILY, read at every CUDA call. The ctest KernelFamilyEnvUnknown runs this test with
// a value the library does not know; the plain run, with it unset. CPU calls never read it; a CUDA
// call with an unknown value fails naming it.
TEST(KernelFamilyEnv, CudaCallsNameAnUnknownValue) {
  const char* env = std::getenv("KF_KERNEL_FAMILY");
  const std::string value = env == nullptr ? "" : env;
  const bool known = value.empty() || value == "auto" || value == "sm80";
  int w = 0;
  EXPECT_EQ(kf_mla_default_num_workers_for_format(-1, 16, 1, KF_KV_BF16, &w), KF_SUCCESS)
      << kf_last_error();
  if (kf_cuda_device_count() == 0) GTEST_SKIP() << "the CPU call checked; no CUDA device visible";
  const kf_status s = kf_mla_default_num_workers_for_format(0, 16, 1, KF_KV_BF16, &w);
  if (known) {
    EXPECT_EQ(s, KF_SUCCESS) << kf_last_error();
  } else {
    EXPECT_EQ(s, KF_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kf_last_error()).find("KF_KERNEL_FAMILY=" + value + " in the environment"),
              std::string::npos)
        << kf_last_error();
  }
}

}  // namespace
