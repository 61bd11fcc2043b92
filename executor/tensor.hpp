// Tensors as strategy code sees them: opaque handles with a shape and a dtype. Only a Backend or a
// Comm dereferences them (their pointer is private; those two classes are the only friends), so a
// host read or write of device memory in model, parameter or trainer code is a compile error, not a
// convention. Host data crosses through Backend::upload / Backend::download and nothing else.
//
//   View    non-owning: a [rows, cols] row-major range of a tensor (a row range or a flat slice)
//   Tensor  owning, move-only: its destructor hands the memory back to the backend, which takes it
//           off the ledger under the tensor's category (device: Mem, host: HostMem)
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "costmodel/memory_model.hpp"

namespace ctx::exec {

enum class DType : uint8_t { f32, bf16, i32, i64 };
constexpr int64_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : t == DType::i64 ? 8 : 4; }
const char* to_string(DType t);

class Backend;
class Comm;
class Tensor;

class View {
 public:
  View() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  int64_t bytes() const { return numel() * dtype_bytes(dt_); }
  DType dtype() const { return dt_; }
  explicit operator bool() const { return p_ != nullptr; }
  // rows [r0, r0 + n) of this view
  View row_range(int64_t r0, int64_t n) const {
    check(r0 >= 0 && n >= 0 && r0 + n <= rows_, "row_range");
    return View(static_cast<char*>(p_) + r0 * cols_ * dtype_bytes(dt_), dt_, n, cols_);
  }
  // elements [off, off + n) as a [1, n] view
  View flat(int64_t off, int64_t n) const {
    check(off >= 0 && n >= 0 && off + n <= numel(), "flat");
    return View(static_cast<char*>(p_) + off * dtype_bytes(dt_), dt_, 1, n);
  }
  // the same elements as [rows, cols]
  View as(int64_t rows, int64_t cols) const {
    check(rows * cols == numel(), "as");
    return View(p_, dt_, rows, cols);
  }
  bool same_memory(const View& o) const { return p_ == o.p_; }

 private:
  friend class Backend;
  friend class Comm;
  friend class Tensor;
  View(void* p, DType dt, int64_t rows, int64_t cols) : p_(p), dt_(dt), rows_(rows), cols_(cols) {}
  void check(bool ok, const char* what) const {
    if (!ok) throw std::logic_error(std::string("View::") + what + ": out of range of a [" + std::to_string(rows_) +
                                    ", " + std::to_string(cols_) + "] view");
  }
  void* p_ = nullptr;
  DType dt_ = DType::f32;
  int64_t rows_ = 0, cols_ = 0;
};

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

  void reset();  // hands the memory back now (stream-ordered on asynchronous backends)
  explicit operator bool() const { return static_cast<bool>(v_); }
  operator View() const { return v_; }  // NOLINT: a tensor is usable wherever a view is
  View view() const { return v_; }
  View row_range(int64_t r0, int64_t n) const { return v_.row_range(r0, n); }
  View flat(int64_t off, int64_t n) const { return v_.flat(off, n); }
  int64_t rows() const { return v_.rows(); }
  int64_t cols() const { return v_.cols(); }
  int64_t numel() const { return v_.numel(); }
  int64_t bytes() const { return v_.bytes(); }
  DType dtype() const { return v_.dtype(); }
  bool on_host() const { return host_; }
  Mem category() const { return cat_; }
  HostMem host_category() const { return host_cat_; }
  // Re-tags a device tensor (e.g. a fresh activation becoming a saved checkpoint).
  void retag(Mem to);

 private:
  friend class Backend;
  void steal(Tensor& o) {
    v_ = std::exchange(o.v_, View{});
    host_ = o.host_;
    cat_ = o.cat_;
    host_cat_ = o.host_cat_;
    owner_ = std::exchange(o.owner_, nullptr);
  }
  View v_;
  bool host_ = false;
  Mem cat_ = Mem::workspace;
  HostMem host_cat_ = HostMem::runtime;
  Backend* owner_ = nullptr;
};

}  // namespace ctx::exec
