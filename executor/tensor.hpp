// A 2-D row-major float tensor owned by a backend. Move-only: the destructor hands the memory back
// to the backend, which takes it off the ledger under the tensor's category. Device tensors carry
// a Mem category, host tensors (offloaded checkpoints, optimizer states) a HostMem category.
#pragma once
#include <cstdint>
#include <utility>

#include "costmodel/memory_model.hpp"

namespace ctx::exec {

class Backend;

class Tensor {
 public:
  Tensor() = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { steal(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) { reset(); steal(o); }
    return *this;
  }
  ~Tensor() { reset(); }

  void reset();  // frees now
  explicit operator bool() const { return ptr_ != nullptr; }
  float* data() { return ptr_; }
  const float* data() const { return ptr_; }
  float* row(int64_t r) { return ptr_ + r * cols_; }
  const float* row(int64_t r) const { return ptr_ + r * cols_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  int64_t bytes() const { return numel() * static_cast<int64_t>(sizeof(float)); }
  bool on_host() const { return host_; }
  Mem category() const { return cat_; }
  HostMem host_category() const { return host_cat_; }
  // Re-tags a device tensor (e.g. a fresh activation becoming a saved checkpoint).
  void retag(Mem to);

 private:
  friend class Backend;
  void steal(Tensor& o) {
    ptr_ = std::exchange(o.ptr_, nullptr);
    rows_ = std::exchange(o.rows_, 0);
    cols_ = std::exchange(o.cols_, 0);
    host_ = o.host_;
    cat_ = o.cat_;
    host_cat_ = o.host_cat_;
    owner_ = std::exchange(o.owner_, nullptr);
  }
  float* ptr_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
  bool host_ = false;
  Mem cat_ = Mem::workspace;
  HostMem host_cat_ = HostMem::runtime;
  Backend* owner_ = nullptr;
};

}  // namespace ctx::exec
