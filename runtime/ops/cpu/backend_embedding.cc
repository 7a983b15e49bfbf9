// The CPU backend's embedding lookup and its gradient (backend_common.h).

#include <cstring>

#include "runtime/ops/cpu/backend_common.h"

namespace sk::ops {

Status CpuBackend::EmbeddingForward(const OpContext&, const Tensor& table, const Tensor& ids,
                                    const Tensor& out) {
  const int64_t dim = table.shape().dim(1);
  if (table.dtype() == out.dtype()) {
    // A row copied as it is: exact in any dtype.
    const size_t row_bytes = DTypeSize(out.dtype()) * static_cast<size_t>(dim);
    const int32_t* id = ids.data_as<int32_t>();
    for (int64_t n = 0; n < ids.numel(); ++n) {
      std::memcpy(Elem(out, n * dim), Elem(table, static_cast<int64_t>(id[n]) * dim), row_bytes);
    }
    return OkStatus();
  }
  float* buf = Scratch(0, dim);
  const int32_t* id = ids.data_as<int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    FromF32(InF32(table, static_cast<int64_t>(id[n]) * dim, dim, buf), dim, Elem(out, n * dim),
            out.dtype());
  }
  return OkStatus();
}

Status CpuBackend::EmbeddingBackward(const OpContext&, const Tensor& ids, const Tensor& dout,
                                     const Tensor& dtable) {
  const int64_t dim = dtable.shape().dim(1);
  if (IsF32(dout)) {
    sk::EmbeddingBackward(ids.data_as<int32_t>(), F(dout), ids.numel(), dim, F(dtable));
    return OkStatus();
  }
  float* buf = Scratch(0, dim);
  const int32_t* id = ids.data_as<int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    AddInPlace(F(dtable) + static_cast<int64_t>(id[n]) * dim, InF32(dout, n * dim, dim, buf),
               dim);
  }
  return OkStatus();
}

}  // namespace sk::ops
