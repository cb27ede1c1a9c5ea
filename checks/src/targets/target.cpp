#include "tinygpt/checks/target.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>

#include "tinygpt/device.h"
#include "tinygpt/results/result.h"

namespace tinygpt::checks {

Generation DecodeTarget::generate(const at::Tensor& prompt, int64_t n, const TokenChooser& choose) {
  return drive(prompt, n, choose);
}

Generation DecodeTarget::drive(const at::Tensor& prompt, int64_t n, const TokenChooser& choose) {
  if (prompt.dim() != 2 || prompt.size(1) < 1) throw std::invalid_argument("drive: the prompt must be (B, T0) with T0 >= 1");
  if (n < 1) throw std::invalid_argument("drive: n must be >= 1");
  const int64_t T0 = prompt.size(1), w = std::min(T0, context());
  at::Tensor seq = at::empty({prompt.size(0), T0 + n}, prompt.options());  // (B, T0 + n)
  seq.narrow(1, 0, T0).copy_(prompt);
  reset();
  Recorder keep;
  at::Tensor logits = prefill(prompt.narrow(1, T0 - w, w));  // (B, V): the last `context` prompt tokens
  for (int64_t i = 0; i < n; ++i) {
    keep(i, logits);
    const int64_t L = T0 + i;
    at::Tensor next = choose(logits, seq.narrow(1, 0, L)).to(seq.device()).to(at::kLong).view({seq.size(0), 1});  // (B, 1)
    seq.narrow(1, L, 1).copy_(next);
    if (i + 1 < n) logits = step(next);
  }
  return {seq, keep.stacked()};
}

Offers offers_nothing() {
  Offers o;
  for (unsigned i = 0; i < kOpCount; ++i) o.missing[i] = std::string("the target does not support ") + op_name(static_cast<Op>(i));
  o.no_sampler = "the target has no sampler";
  o.no_second_instance = "the target makes no second instance of itself";
  return o;
}

std::string Offers::why_not_speculate(const std::string& draft, AcceptRule rule) const {
  if (const std::string& why = why_not(Op::Speculate); !why.empty()) return why;
  if (const auto it = drafts_missing.find(draft); it != drafts_missing.end() && !it->second.empty()) return it->second;
  if (const auto it = rules_missing.find(accept_rule_name(rule)); it != rules_missing.end() && !it->second.empty()) return it->second;
  return "";
}

const Offers& DecodeTarget::offers() const {
  std::call_once(offered_, [this] { offers_ = make_offers(); });
  return offers_;
}

Offers DecodeTarget::make_offers() const { return offers_nothing(); }

RowServing& DecodeTarget::serving() { throw std::logic_error(offers().why_not(Op::Ragged)); }
const props::SamplerUnderTest& DecodeTarget::sampler() const { throw std::logic_error(offers().no_sampler); }
std::unique_ptr<DecodeTarget> DecodeTarget::second_instance() const { throw std::logic_error(offers().no_second_instance); }

int DecodeTarget::set_threads(int) { throw std::logic_error(offers().why_not(Op::Threads)); }
std::vector<ServedResult> DecodeTarget::serve(const std::vector<ServedRequest>&) { throw std::logic_error(offers().why_not(Op::Generate)); }
SpeculativeAnswer DecodeTarget::speculate(const SpeculativeRequest&) { throw std::logic_error(offers().why_not(Op::Speculate)); }
Generation DecodeTarget::seeded(const at::Tensor& prompt, int64_t n, const SamplingSettings& s, uint64_t seed) {
  return generate(prompt, n, tinygpt::sampler(s, make_generator(prompt.device(), seed)));
}

const std::vector<std::string>& draft_kinds() {
  static const std::vector<std::string> kinds = {"none", "self", "contrary", "ngram", "model", "replay"};
  return kinds;
}

namespace {
// The draft "none": no drafts, so every round is one plain step and one draw of the target's stream.
class NoDrafter final : public Drafter {
 public:
  std::string name() const override { return "none"; }
  void reset() override {}
  Proposal propose(const std::vector<int64_t>&, int64_t, const SamplingSettings&, at::Generator&, const SpeculativeRules&) override {
    return {};
  }
};
}  // namespace

SpeculativeAnswer ModelTarget::speculate(const SpeculativeRequest& r) {
  // One decoder and one drafter per kind, kept between requests: many draws from one prompt start from a
  // copy of its entries (SpeculativeDecoder and ModelDrafter keep the last prompt's).
  if (std::find(draft_kinds().begin(), draft_kinds().end(), r.draft) == draft_kinds().end())
    throw std::invalid_argument("speculate: unknown draft '" + r.draft + "' (" + results::join(draft_kinds()) + ")");
  const bool is_model = r.draft == "model";
  if (is_model) {
    if (!r.draft_model) throw std::invalid_argument("speculate: the draft 'model' needs a draft model");
    if (r.draft_model->config().vocab_size != model_->config().vocab_size)
      throw std::invalid_argument("speculate: the draft model's vocabulary (" + std::to_string(r.draft_model->config().vocab_size) +
                                  ") is not the target's (" + std::to_string(model_->config().vocab_size) + ")");
  }
  if (!speculative_)
    speculative_ = std::make_unique<SpeculativeDecoder>(model_, variant_->make_cache(model_->config()),
                                                        variant_->speculative ? *variant_->speculative : production_rules(),
                                                        variant_->kernels);
  if (r.draft == "replay") {  // its ids are the request's: a drafter of its own
    ReplayDrafter replay(r.replay, model_->config().vocab_size, r.replay_shift, r.replay_period);
    return {speculative_->run(r.prompt, r.n, replay, r.settings, r.then_plain), {}};
  }
  const std::string key = is_model ? "model@" + std::to_string(reinterpret_cast<uintptr_t>(r.draft_model.get())) : r.draft;
  std::unique_ptr<Drafter>& drafter = drafters_[key];
  if (!drafter) {
    // Drafts from a model compute as the variant's own steps do (its kernels): the target's own weights
    // then draft exactly what its plain steps choose.
    if (r.draft == "none") drafter = std::make_unique<NoDrafter>();
    else if (r.draft == "self") drafter = std::make_unique<ModelDrafter>(model_, false, variant_->kernels);
    else if (r.draft == "contrary") drafter = std::make_unique<ModelDrafter>(model_, /*contrary=*/true, variant_->kernels);
    else if (r.draft == "ngram") drafter = std::make_unique<NgramDrafter>();
    else drafter = std::make_unique<ModelDrafter>(r.draft_model, false, variant_->kernels);
  }
  return {speculative_->run(r.prompt, r.n, *drafter, r.settings, r.then_plain), {}};
}

ModelTarget::ModelTarget(GPT model, const CacheVariant& variant)
    : base_(std::move(model)), model_(variant.model(base_)), variant_(&variant), decoder_(variant.decoder(model_->config())),
      sampler_(props::production_sampler()) {}

ModelTarget::~ModelTarget() = default;

int64_t ModelTarget::context() const { return model_->config().context; }

void ModelTarget::reset() {
  decoder_.cache->reset();
  fed_ = 0;
  rows_.reset();
}

int ModelTarget::set_threads(int n) {
  const int before = at::get_num_threads();
  tinygpt::set_threads(n);
  return before;
}

Offers ModelTarget::make_offers() const {
  // Rows decode through the model's own step at per-row positions (serving.h), not through a step
  // function bound to one cache: whether the variant's caches can be cloned and truncated decides,
  // and for save and shift whether they give their entries.
  const auto probe = variant_->make_cache(model_->config());
  const std::string rows = probe->row_ops_unsupported();
  const std::string entries = rows.empty() ? probe->save_unsupported() : rows;
  Offers o;
  for (unsigned i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    switch (op) {
      case Op::Threads: break;  // LibTorch's threads, whatever the cache
      case Op::Generate:
      case Op::GenerateShift: o.missing[i] = "our model has no scheduler of its own: the serving rows drive its rows directly"; break;
      case Op::RowSampling:
      case Op::Bench: o.missing[i] = std::string("our model is not an engine: ") + op_name(op) + " is the protocol's"; break;
      case Op::Save:
      case Op::Shift: o.missing[i] = entries; break;
      default: o.missing[i] = rows;  // speculation too: rejected drafts are rolled back by the cache's truncate, as for rows
    }
  }
  return o;
}

RowBatch& ModelTarget::rows() {
  if (!rows_) {
    const std::string why = offers().why_not(Op::Ragged);  // rows at all: the variant's caches can be cloned and truncated
    if (!why.empty()) throw std::logic_error(why);
    const CacheVariant* v = variant_;
    const Config cfg = model_->config();
    rows_ = std::make_unique<RowBatch>(*model_, [v, cfg] { return v->make_cache(cfg); }, decoder_.path,
                                       v->serving ? *v->serving : production_serving());
  }
  return *rows_;
}

std::vector<int64_t> ModelTarget::add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) {
  return rows().add(prompts, logits);
}
at::Tensor ModelTarget::step_rows(const std::vector<int64_t>& r, const std::vector<int64_t>& ids) { return rows().step(r, ids); }
at::Tensor ModelTarget::extend_row(int64_t row, const std::vector<int64_t>& ids) { return rows().extend(row, ids)[0]; }
int64_t ModelTarget::fork_row(int64_t row) { return rows().fork(row); }
void ModelTarget::truncate_row(int64_t row, int64_t n) { rows().truncate(row, n); }
void ModelTarget::release_row(int64_t row) { rows().release(row); }
std::vector<int64_t> ModelTarget::reused() const { return rows_ ? rows_->reused() : std::vector<int64_t>{}; }
std::string ModelTarget::save_row(int64_t row) { return to_bytes(rows().save(row)); }
int64_t ModelTarget::restore_row(const std::string& state) { return rows().restore(row_state_from_bytes(state)); }
void ModelTarget::shift_row(int64_t row, int64_t keep, int64_t discard) { rows().shift(row, keep, discard); }
std::unique_ptr<DecodeTarget> ModelTarget::second_instance() const { return std::make_unique<ModelTarget>(base_, *variant_); }

at::Tensor ModelTarget::prefill(const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  if (ids.size(1) > context()) throw std::invalid_argument("prefill: " + std::to_string(ids.size(1)) + " tokens exceed the context");
  at::Tensor out = decode_step(*model_, ids, *decoder_.cache, /*start=*/0, decoder_.path);  // (B, V)
  fed_ = ids.size(1);
  return out;
}

at::Tensor ModelTarget::step(const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  if (ids.dim() != 2 || ids.size(1) != 1) throw std::invalid_argument("step: one token per row, (B, 1)");
  at::Tensor out = decode_step(*model_, ids, *decoder_.cache, fed_, decoder_.path);  // SPEC 4: position = tokens fed so far
  ++fed_;
  return out;
}

Generation ModelTarget::generate(const at::Tensor& prompt, int64_t n, const TokenChooser& choose) {
  at::NoGradGuard no_grad;
  Recorder keep;
  Generation g;
  g.seq = generate_cached(model_, prompt, n, choose, *decoder_.cache, decoder_.path, keep.observer());
  g.logits = keep.stacked();
  return g;
}

at::Tensor shifted_rows(const at::Tensor& row, int64_t rows, int64_t vocab, int64_t stride) {
  at::Tensor shift = at::arange(rows, row.options()).unsqueeze(1) * stride;  // (rows, 1)
  return (row + shift).remainder(vocab);                                      // (rows, T0)
}

}  // namespace tinygpt::checks
