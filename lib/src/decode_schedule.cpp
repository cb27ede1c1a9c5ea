#include "tinygpt/decode_schedule.h"

#include <algorithm>

#include "tinygpt/kv_cache.h"

namespace tinygpt {

void DecodeSchedule::begin(KVCache& cache) const { cache.reset(); }

int64_t DecodeSchedule::prefill_start(int64_t prompt_len, int64_t context) const {
  return std::max<int64_t>(0, prompt_len - context);
}

int64_t DecodeSchedule::position(int64_t fed, int64_t /*context*/) const { return fed; }

at::Tensor DecodeSchedule::history(const at::Tensor& seq, int64_t /*prompt_len*/) const { return seq; }

const DecodeSchedule& production_schedule() {
  static const DecodeSchedule schedule;
  return schedule;
}

}  // namespace tinygpt
