// Compile-time check that the kernels' error flags equal the public KF_DEVERR_* values.
#include "cuda/common/device_error.cuh"
#include "kernelflow/kernelflow.h"

static_assert(kf::cuda::kDevErrSeqlenRange == KF_DEVERR_SEQLEN_RANGE, "flag mismatch");
static_assert(kf::cuda::kDevErrPageRange == KF_DEVERR_PAGE_RANGE, "flag mismatch");
static_assert(kf::cuda::kDevErrMetadata == KF_DEVERR_METADATA, "flag mismatch");
static_assert(kf::cuda::kDevErrSlotRange == KF_DEVERR_SLOT_RANGE, "flag mismatch");
