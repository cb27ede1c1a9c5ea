// The model with SPEC 10's knobs: each zoo member's cached decode equals its banded uncached reference
// past every layer's window; the knobs mean what SPEC 10 says (a sliding layer's w includes the query,
// query head h reads KV head h / group, the cache stores G heads); configs round-trip through JSON and
// safetensors; the fast paths refuse a member by naming its knob. tests/zoo/ holds the knobs against
// transformers' own classes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <unistd.h>
#include <stdexcept>
#include <string>

#include "tinygpt/checkpoint.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/generate.h"
#include "tinygpt/gpt.h"
#include "tinygpt/int8_kv_cache.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/ring_kv_cache.h"
#include "tinygpt/rope_scaling.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/serving.h"
#include "tinygpt/speculative.h"
#include "tinygpt/static_kv_cache.h"
#include "tinygpt/zoo.h"

namespace tinygpt {
namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// A member with random weights, made sharper than the initialisation's (scores and logits of order 1,
// not 0.01), so a wrong key attended to moves the logits well past float rounding.
GPT sharp_model(const Config& c, uint64_t seed = 1) {
  GPT m(c, seed);
  m->eval();
  at::NoGradGuard ng;
  for (const auto& item : m->named_parameters())
    if (item.key().find("norm") == std::string::npos) item.value().mul_(4.0);
  return m;
}

at::Tensor ids(int64_t n, uint64_t seed = 7) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randint(0, 4096, {1, n}, g, at::kLong);
}

// The cached run: a prefill of `prefill` tokens, then one token a step to n. Returns (n - prefill + 1, V):
// the logits at positions prefill-1 .. n-1.
at::Tensor cached_run(GPT& m, KVCache& cache, const at::Tensor& idx, int64_t prefill) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> out;
  out.push_back(m->step(idx.narrow(1, 0, prefill), cache, 0));  // (1, V)
  for (int64_t p = prefill; p < idx.size(1); ++p) out.push_back(m->step(idx.narrow(1, p, 1), cache, p));
  return at::cat(out, 0);
}

// SPEC 4's reference extended by SPEC 10: every position through the banded forward, each sliding
// layer banded by its own w. (n - prefill + 1, V) as cached_run.
at::Tensor banded_run(GPT& m, const at::Tensor& idx, int64_t prefill) {
  at::NoGradGuard ng;
  const int64_t n = idx.size(1);
  return m->forward_with(idx, BandedPolicy(m->config().context + 1)).select(0, 0).narrow(0, prefill - 1, n - prefill + 1);
}

class ZooMember : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooMember, CachedDecodeIsTheBandedReferencePastEveryWindow) {
  const Config c = zoo_config(GetParam());
  GPT m = sharp_model(c);
  const at::Tensor idx = ids(600);
  RollingKVCache cache(c);
  const at::Tensor got = cached_run(m, cache, idx, 37), want = banded_run(m, idx, 37);
  EXPECT_LT(max_diff(got, want), 2e-4) << c.to_string();
  EXPECT_GT(want.abs().max().item<double>(), 1.0) << "the sharpened model's logits are of order 1";
  // Inside the window the banded reference is the plain forward.
  at::NoGradGuard ng;
  EXPECT_LT(max_diff(m->forward(idx.narrow(1, 0, 256)).select(0, 0).narrow(0, 36, 220), want.narrow(0, 0, 220)), 2e-4);
}

TEST_P(ZooMember, ConfigRoundTripsThroughJsonAndSafetensors) {
  const Config c = zoo_config(GetParam());
  EXPECT_EQ(config_from_json(config_to_json(c)), c);
  EXPECT_EQ(c.zoo_knob().empty(), false);
  GPT m = sharp_model(c);
  Checkpoint ck;
  ck.config = c;
  ck.tensors = m->state_dict();
  const auto path = std::filesystem::temp_directory_path() / ("zoo-" + GetParam() + "-" + std::to_string(::getpid()) + ".safetensors");
  write_safetensors_checkpoint(path.string(), ck);
  GPT back = load_checkpoint(path.string(), at::kCPU);
  std::filesystem::remove(path);
  EXPECT_EQ(back->config(), c);
  at::NoGradGuard ng;
  const at::Tensor x = ids(40);
  EXPECT_TRUE(back->forward(x).equal(m->forward(x)));
}

TEST_P(ZooMember, FastPathsRefuseNamingTheKnob) {
  const Config c = zoo_config(GetParam());
  const std::string knob = c.zoo_knob();
  for (auto make : std::vector<std::function<void()>>{[&] { StaticKVCache s(c); }, [&] { Int8KVCache s(c); }, [&] { RingKVCache s(c); }}) {
    try {
      make();
      ADD_FAILURE() << "a fast cache accepted " << GetParam();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(knob), std::string::npos) << e.what();
    }
  }
}

TEST_P(ZooMember, ServingRowsDecodeAsOneRow) {
  // RowBatch (serving.h) on a member: two rows of different lengths stepped together give each row's
  // own logits, and a rollback and a fork continue as a fresh row would.
  const Config c = zoo_config(GetParam());
  GPT m = sharp_model(c);
  const at::Tensor a = ids(150, 3), b = ids(90, 4);
  at::NoGradGuard ng;
  RowBatch rows(*m, [&c] { return std::make_unique<RollingKVCache>(c); }, DecodePath{});
  auto first = [](const at::Tensor& t, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = t[0][i].item<int64_t>();
    return v;
  };
  at::Tensor logits;
  const auto got = rows.add({first(a, 100), first(b, 40)}, logits);
  const int64_t ra = got.at(0), rb = got.at(1);
  at::Tensor la, lb;
  for (int64_t i = 0; i < 50; ++i) {
    const at::Tensor l = rows.step({ra, rb}, {a[0][100 + i].item<int64_t>(), b[0][40 + i].item<int64_t>()});  // (2, V)
    la = l[0], lb = l[1];
  }
  const at::Tensor wa = banded_run(m, a, 150).select(0, 0), wb = banded_run(m, b, 90).select(0, 0);
  EXPECT_LT(max_diff(la, wa), 2e-4);
  EXPECT_LT(max_diff(lb, wb), 2e-4);
}

TEST_P(ZooMember, SpeculativeRowsInOneBatchAreEachRowsGreedy) {
  // speculate_rows (speculative.h) on a member: three rows in one RowBatch, each with a draft of its own
  // (its plain run replayed with every third id wrong, prompt lookup, the plain run replayed), 270 new
  // ids past the window and every sliding one at k = 4: each row's ids and logits are its plain greedy's.
  const Config c = zoo_config(GetParam());
  GPT m = sharp_model(c);
  at::NoGradGuard ng;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {40, 41, 42, 43, 44, 45, 46, 47}, {9}};
  const int64_t n = 270;
  std::vector<std::vector<int64_t>> whole;
  std::vector<at::Tensor> want;  // (n, V) per row
  for (const auto& p : prompts) {
    RollingKVCache cache(c);
    Recorder rec;
    const at::Tensor seq = generate_cached(m, at::tensor(p, at::kLong).unsqueeze(0), n, greedy(), cache, {}, rec.observer())[0];
    whole.emplace_back(seq.data_ptr<int64_t>(), seq.data_ptr<int64_t>() + seq.numel());
    want.push_back(rec.stacked()[0]);
  }
  size_t next = 0;
  auto make = [&]() -> std::unique_ptr<Drafter> {
    const size_t b = next++;
    if (b == 0) return std::make_unique<ReplayDrafter>(whole[0], c.vocab_size, 1, 3);
    if (b == 1) return std::make_unique<NgramDrafter>();
    return std::make_unique<ReplayDrafter>(whole[2], c.vocab_size);
  };
  SpeculativeSettings s;
  s.k = 4;
  s.sampling.temperature = 0;
  RowBatch rows(*m, [&c] { return std::make_unique<RollingKVCache>(c); }, DecodePath{});
  const auto runs = speculate_rows(rows, make, prompts, n, s);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<int64_t> ids(whole[b].begin() + static_cast<int64_t>(prompts[b].size()), whole[b].end());
    ASSERT_EQ(runs[b].ids, ids) << "row " << b;
    EXPECT_LT(max_diff(runs[b].logits, want[b]), 2e-4) << "row " << b;
  }
  EXPECT_LT(runs[0].accepted, runs[0].drafted);
  EXPECT_EQ(runs[2].accepted, runs[2].drafted);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooMember, ::testing::ValuesIn(zoo_names()), [](const auto& info) { return info.param; });

TEST(ZooModel, SeedConfigSetsNoKnobAndWritesTheSeriesJson) {
  EXPECT_EQ(Config{}.zoo_knob(), "");
  EXPECT_EQ(config_to_json(Config{}), R"({"context":256,"d_model":256,"dropout":0.1,"n_heads":4,"n_layers":6,"vocab_size":4096})");
  Config c;
  c.n_kv_heads = 4;  // = n_heads: still multi-head
  c.head_size = 64;  // = d / H
  EXPECT_EQ(c.zoo_knob(), "");
}

TEST(ZooModel, JsonRefusesUnknownKeysAndWrongTypesByName) {
  auto refused = [](const std::string& text, const std::string& name) {
    try {
      config_from_json(text);
      ADD_FAILURE() << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  const std::string base = R"("vocab_size":4096,"d_model":128,"n_heads":4,"n_layers":2,"context":256)";
  refused("{" + base + R"(,"n_kv_head":2})", "n_kv_head");
  refused("{" + base + R"(,"norm":"batchnorm"})", "batchnorm");
  refused("{" + base + R"(,"qk_norm":"yes"})", "qk_norm");
  refused("{" + base + R"(,"rope_scaling":{"kind":"yarn","factor":4,"mscale":1}})", "mscale");
  refused("{" + base + R"(,"n_kv_heads":3})", "n_kv_heads");
  refused("{" + base + R"(,"layer_types":["sliding","full"]})", "sliding_window");
  refused(R"({"vocab_size":4096})", "d_model");
}

TEST(ZooModel, ValidationNamesTheKnob) {
  auto rejected = [](auto change, const std::string& field) {
    Config c = zoo_config("mistral");
    change(c);
    try {
      c.validate();
      ADD_FAILURE() << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  rejected([](Config& c) { c.n_kv_heads = 3; }, "n_kv_heads");
  rejected([](Config& c) { c.sliding_window = 0; }, "sliding_window");
  rejected([](Config& c) { c.sliding_window = 257; }, "sliding_window");
  rejected([](Config& c) { c.layer_types.pop_back(); }, "layer_types");
  rejected([](Config& c) { c.mlp_bias = true; }, "mlp_bias");
  rejected([](Config& c) { c.norm = NormKind::LayerNorm, c.qk_norm = true; }, "qk_norm");
  rejected([](Config& c) { c.partial_rotary = 0.01; }, "partial_rotary");
  rejected([](Config& c) { c.attn_softcap = -1; }, "attn_softcap");
  rejected([](Config& c) { c.rope_scaling.kind = RopeScaling::Kind::Yarn, c.rope_scaling.factor = 4; }, "original_context");
  EXPECT_THROW(zoo_config("falcon"), std::invalid_argument);
}

TEST(ZooModel, SlidingLayerSeesTheWMostRecentKeysIncludingItsOwn) {
  // One sliding layer, w = 8: the logits at position i depend on tokens i-7 .. i and on no earlier one.
  Config c = zoo_config("mistral");
  c.n_layers = 1, c.layer_types = {LayerKind::Sliding}, c.sliding_window = 8;
  GPT m = sharp_model(c);
  at::NoGradGuard ng;
  const at::Tensor x = ids(40);
  const at::Tensor base = m->forward(x).select(0, 0)[30];
  at::Tensor y = x.clone();
  y[0][22] = (x[0][22].item<int64_t>() + 1) % 4096;  // i - w: outside the window
  EXPECT_TRUE(m->forward(y).select(0, 0)[30].equal(base));
  y = x.clone();
  y[0][23] = (x[0][23].item<int64_t>() + 1) % 4096;  // i - w + 1: the oldest key it sees
  EXPECT_GT(max_diff(m->forward(y).select(0, 0)[30], base), 1e-3);
}

// The sliding window applied in the prefill's mask only: a decode query's mask ignores the layer's w.
class WindowOnlyInPrefill final : public AttentionPolicy {
 public:
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override {
    return AttentionPolicy::mask(tq, tk, opts, tq == 1 ? 0 : window);
  }
};

// cached_run with a policy of its own.
at::Tensor cached_run_with(GPT& m, KVCache& cache, const at::Tensor& idx, int64_t prefill, const AttentionPolicy& policy) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> out;
  out.push_back(m->step(idx.narrow(1, 0, prefill), cache, 0, policy));
  for (int64_t p = prefill; p < idx.size(1); ++p) out.push_back(m->step(idx.narrow(1, p, 1), cache, p, policy));
  return at::cat(out, 0);
}

TEST(ZooModel, DecodePastTheSlidingWindowIsCaught) {
  // The negative control of CachedDecodeIsTheBandedReferencePastEveryWindow. A sliding layer's window
  // holds in decode by two guards - the cache keeps w - 1 entries, and the mask bands - and either
  // alone keeps it; a cache that keeps the full context on a sliding layer AND a decode mask without
  // the band (SGLang PR #4823's shape: the window never reached the kernel) parts from the reference
  // past w, and the comparison sees it.
  const Config c = zoo_config("mistral");
  GPT m = sharp_model(c);
  const at::Tensor idx = ids(200);
  const at::Tensor want = banded_run(m, idx, 37);
  RollingKVCache right(c), full(c.n_layers, c.context), full2(c.n_layers, c.context);
  EXPECT_LT(max_diff(cached_run_with(m, right, idx, 37, WindowOnlyInPrefill()), want), 2e-4) << "the cache's trim alone";
  EXPECT_LT(max_diff(cached_run(m, full, idx, 37), want), 2e-4) << "the decode mask's band alone";
  const at::Tensor got = cached_run_with(m, full2, idx, 37, WindowOnlyInPrefill());
  EXPECT_LT(max_diff(got.narrow(0, 0, 28), want.narrow(0, 0, 28)), 2e-4) << "inside w the windows agree";
  EXPECT_GT(max_diff(got, want), 1e-2) << "past w a decode query saw keys its layer must not";
}

TEST(ZooModel, QueryHeadReadsKvHeadHOverGroup) {
  // A GQA model equals the multi-head model whose k and v rows repeat each KV head for its group
  // (transformers' repeat_kv); repeating them interleaved (h % G) is another model.
  Config c = zoo_config("llama");  // 8 query heads, 2 KV heads
  GPT gqa = sharp_model(c);
  const int64_t H = c.n_heads, G = c.kv_heads(), hd = c.head_dim(), group = H / G;
  auto mha_of = [&](bool interleaved) {
    Config mc = c;
    mc.n_kv_heads = H;
    GPT mha(mc, 2);
    mha->eval();
    at::NoGradGuard ng;
    for (const auto& item : gqa->named_parameters()) {
      if (item.key().find("attn.qkv.weight") == std::string::npos) {
        mha->named_parameters()[item.key()].copy_(item.value());
        continue;
      }
      const at::Tensor w = item.value();  // ((H + 2G) hd, d)
      const at::Tensor q = w.narrow(0, 0, H * hd), k = w.narrow(0, H * hd, G * hd), v = w.narrow(0, (H + G) * hd, G * hd);
      auto widen = [&](const at::Tensor& t) {  // (G hd, d) -> (H hd, d)
        const at::Tensor g = t.view({G, hd, -1});
        return (interleaved ? g.repeat({group, 1, 1}) : g.repeat_interleave(group, 0)).reshape({H * hd, -1});
      };
      mha->named_parameters()[item.key()].copy_(at::cat({q, widen(k), widen(v)}, 0));
    }
    return mha;
  };
  at::NoGradGuard ng;
  const at::Tensor x = ids(64);
  const at::Tensor want = gqa->forward(x);
  EXPECT_LT(max_diff(mha_of(false)->forward(x), want), 1e-4);
  EXPECT_GT(max_diff(mha_of(true)->forward(x), want), 1e-2);
}

TEST(ZooModel, CacheStoresTheKvHeadsOnly) {
  const Config c = zoo_config("mqa");
  GPT m = sharp_model(c);
  RollingKVCache cache(c);
  at::NoGradGuard ng;
  m->step(ids(10), cache, 0);
  const auto [K, V] = cache.stored(0);
  EXPECT_EQ(K.sizes(), (std::vector<int64_t>{1, 1, 10, c.head_dim()}));
  EXPECT_EQ(cache.bytes(), 2 * c.n_layers * 10 * c.kv_heads() * c.head_dim() * 4);
}

TEST(ZooModel, SlidingLayersKeepTheirOwnWindowAndRollBack) {
  const Config c = zoo_config("gemma2");  // layers 0 and 2 slide with w = 64
  GPT m = sharp_model(c);
  const at::Tensor idx = ids(300);
  RollingKVCache cache(c);
  at::NoGradGuard ng;
  cached_run(m, cache, idx.narrow(1, 0, 280), 20);
  EXPECT_EQ(cache.stored(0).first.size(2), 63 + kRollbackEntries);
  EXPECT_EQ(cache.stored(1).first.size(2), 256 + 24);  // a full layer: everything up to context + 64
  // Roll back 30 tokens and decode again: the same logits as a run that never fed them.
  cache.truncate(30);
  const at::Tensor again = m->step(idx.narrow(1, 250, 1), cache, 250);
  const at::Tensor want = banded_run(m, idx.narrow(1, 0, 251), 251).select(0, 0);
  EXPECT_LT(max_diff(again.select(0, 0), want), 2e-4);
}

std::vector<int64_t> as_ids(const at::Tensor& t, int64_t from, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < from + n; ++i) v.push_back(t[0][i].item<int64_t>());
  return v;
}

TEST(ZooModel, ContextShiftAndRollbackOnSlidingLayersUseOnlyTheirWindow) {
  // A row of 200 tokens on gemma2: its sliding layers hold positions 73 .. 199 only. A context shift
  // (keep 4, drop 60) and a rollback then decode as on a cache that kept every entry (the band in the
  // mask keeps that one's window) - and a shift or a rollback that would need an entry a sliding
  // layer no longer holds is refused, not computed from a short window.
  const Config c = zoo_config("gemma2");
  GPT m = sharp_model(c);
  const at::Tensor x = ids(260, 11);
  at::NoGradGuard ng;
  RowBatch windowed(*m, [&c] { return std::make_unique<RollingKVCache>(c); }, DecodePath{});
  RowBatch everything(*m, [&c] { return std::make_unique<RollingKVCache>(c.n_layers, c.context); }, DecodePath{});
  at::Tensor la, lb;
  const int64_t a = windowed.add({as_ids(x, 0, 200)}, la).at(0), b = everything.add({as_ids(x, 0, 200)}, lb).at(0);
  EXPECT_LT(max_diff(la, lb), 2e-4);
  EXPECT_EQ(windowed.cache(a).stored_length(0), 63 + kRollbackEntries);
  windowed.shift(a, 4, 60);
  everything.shift(b, 4, 60);
  for (int64_t i = 200; i < 230; ++i) {
    la = windowed.step({a}, {x[0][i].item<int64_t>()});
    lb = everything.step({b}, {x[0][i].item<int64_t>()});
    ASSERT_LT(max_diff(la, lb), 2e-4) << "step " << i;
  }
  windowed.truncate(a, 20);
  everything.truncate(b, 20);
  EXPECT_LT(max_diff(windowed.step({a}, {5}), everything.step({b}, {5})), 2e-4);
  // Refused: the shifted row's window would reach back before what layer 0 holds.
  EXPECT_THROW(windowed.shift(a, 60, 80), std::invalid_argument);
  EXPECT_THROW(windowed.truncate(a, 100), std::invalid_argument);
}

TEST(ZooModel, UntiedHeadIsItsOwnWeight) {
  const Config c = zoo_config("neox");
  GPT m(c, 1);
  const auto sd = m->state_dict();
  int heads = 0;
  for (const auto& [name, t] : sd)
    if (name == "head.weight") {
      ++heads;
      EXPECT_FALSE(t.equal(m->emb->weight));
    }
  EXPECT_EQ(heads, 1);
}

TEST(ZooModel, AVariantSharesItsBasesWeightsAndStatesOnlyItsFormulaOtherwise) {
  // model_variant: the base's tensors themselves; the default formulas compute the base's logits bit
  // for bit; each named formula changes what it names (decode soft-cap: one-query steps only), and a
  // weight replaced in the variant leaves the base's alone.
  const Config c = zoo_config("gemma2");
  GPT base(c, 3);
  const at::Tensor idx = at::randint(c.vocab_size, {1, 12}, at::kLong);
  GPT same = model_variant(base, c);
  EXPECT_EQ(same->emb->weight.data_ptr(), base->emb->weight.data_ptr());
  EXPECT_TRUE(same->forward(idx).equal(base->forward(idx)));

  FormulaVariant no_decode_cap;
  no_decode_cap.decode_softcap = false;
  GPT v = model_variant(base, c, no_decode_cap);
  EXPECT_TRUE(v->forward(idx).equal(base->forward(idx)));  // T = 12: capped as the base is
  RollingKVCache a(c), b(c);
  base->step(idx, a, 0), v->step(idx, b, 0);
  const at::Tensor next = at::randint(c.vocab_size, {1, 1}, at::kLong);
  EXPECT_GT(max_diff(v->step(next, b, 12), base->step(next, a, 12)), 0.0);  // T = 1: uncapped

  GPT w = model_variant(base, c);
  const at::Tensor before = base->norm->weight.clone();
  {
    at::NoGradGuard g;
    w->norm->weight.set_data(w->norm->weight + 1.0);
  }
  EXPECT_TRUE(base->norm->weight.equal(before));

  Config wider = c;
  wider.vocab_size += 1;  // the embedding's rows
  EXPECT_THROW(model_variant(base, wider), std::invalid_argument);
}

TEST(ZooModel, RotationTurnAppliesTheAttentionFactorOnce) {
  // A context shift turns cached keys on by delta positions: turn(apply(x, p), d) = apply(x, p + d),
  // YaRN's factor included once (llama.cpp PR #17945's bug multiplies it twice).
  const Config c = zoo_config("qwen3");
  const Rotation r(rope_spec(c), c.rope_pairing);
  ASSERT_GT(rope_attention_factor(r.spec()), 1.0);
  const at::Tensor x = at::randn({1, 2, 5, c.head_dim()});
  const at::Tensor p = at::arange(100, 105, at::kLong);
  EXPECT_LT(max_diff(r.turn(r.apply(x, p), -37), r.apply(x, p - 37)), 1e-4);
}

}  // namespace
}  // namespace tinygpt
