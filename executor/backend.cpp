#include "executor/backend.hpp"

namespace ctx::exec {

Tensor Backend::alloc(int64_t rows, int64_t cols, Mem cat) {
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.cat_ = cat;
  t.host_ = false;
  t.owner_ = this;
  t.ptr_ = raw_alloc(t.bytes(), false);
  fill(t.ptr_, 0.0f, t.numel());
  ledger_.on_alloc(cat, t.bytes());
  return t;
}

Tensor Backend::alloc_host(int64_t rows, int64_t cols, HostMem cat) {
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.host_cat_ = cat;
  t.host_ = true;
  t.owner_ = this;
  t.ptr_ = raw_alloc(t.bytes(), true);
  fill(t.ptr_, 0.0f, t.numel());
  ledger_.on_host_alloc(cat, t.bytes());
  return t;
}

void Backend::free_tensor(Tensor& t) {
  if (!t.ptr_) return;
  if (t.host_) ledger_.on_host_free(t.host_cat_, t.bytes());
  else ledger_.on_free(t.cat_, t.bytes());
  raw_free(t.ptr_, t.host_);
  t.ptr_ = nullptr;
  t.owner_ = nullptr;
  t.rows_ = t.cols_ = 0;
}

void Backend::retag(Tensor& t, Mem to) {
  if (!t.ptr_ || t.host_ || t.cat_ == to) return;
  ledger_.retag(t.cat_, to, t.bytes());
  t.cat_ = to;
}

void Tensor::reset() {
  if (ptr_ && owner_) owner_->free_tensor(*this);
}

void Tensor::retag(Mem to) {
  if (owner_) owner_->retag(*this, to);
}

}  // namespace ctx::exec
