// A KV cache of this project's own: keys and values in fixed pages of 32 positions per layer,
// joined when attention needs them. Not tinygpt's code: the point is to verify it with the kit.
#pragma once

#include <ATen/ATen.h>
#include <tinygpt/config.h>
#include <tinygpt/kv_cache.h>

#include <deque>
#include <vector>

class PagedKVCache final : public tinygpt::KVCache {
 public:
  explicit PagedKVCache(const tinygpt::Config& cfg);
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;

 private:
  static constexpr int64_t kPage = 32;
  struct Layer {
    std::deque<at::Tensor> k, v;  // pages (B, H, <= kPage, hd), oldest first
    int64_t skip = 0;             // positions of the first page already evicted
    int64_t stored = 0;           // positions kept
  };
  int64_t context_;
  std::vector<Layer> layers_;
};
