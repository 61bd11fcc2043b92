#include "executor/backend.hpp"

#include "executor/comm.hpp"

namespace ctx::exec {

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::unique_ptr<Comm> Backend::make_comm(std::unique_ptr<HostComm> group) {
  return make_host_staged_comm(*this, std::move(group));
}

Tensor Backend::alloc(int64_t rows, int64_t cols, DType dt, Mem cat) {
  Tensor t;
  const int64_t bytes = rows * cols * dtype_bytes(dt);
  alloc_category_ = to_string(cat);
  t.v_ = View(raw_alloc(bytes, false), dt, rows, cols);
  t.cat_ = cat;
  t.host_ = false;
  t.owner_ = this;
  ledger_.on_alloc(cat, bytes);
  return t;
}

Tensor Backend::alloc_host(int64_t rows, int64_t cols, DType dt, HostMem cat) {
  Tensor t;
  const int64_t bytes = rows * cols * dtype_bytes(dt);
  alloc_category_ = "pinned host memory";
  t.v_ = View(raw_alloc(bytes, true), dt, rows, cols);
  t.host_cat_ = cat;
  t.host_ = true;
  t.owner_ = this;
  ledger_.on_host_alloc(cat, bytes);
  return t;
}

void Backend::free_tensor(Tensor& t) {
  if (!t.v_) return;
  if (t.host_) ledger_.on_host_free(t.host_cat_, t.bytes());
  else ledger_.on_free(t.cat_, t.bytes());
  raw_free(t.v_.p_, t.host_);
  t.v_ = View{};
  t.owner_ = nullptr;
}

void Backend::retag(Tensor& t, Mem to) {
  if (!t.v_ || t.host_ || t.cat_ == to) return;
  ledger_.retag(t.cat_, to, t.bytes());
  t.cat_ = to;
}

void Tensor::reset() {
  if (v_ && owner_) owner_->free_tensor(*this);
}

void Tensor::retag(Mem to) {
  if (owner_) owner_->retag(*this, to);
}

}  // namespace ctx::exec
