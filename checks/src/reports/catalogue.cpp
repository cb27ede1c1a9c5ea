#include "tinygpt/checks/catalogue.h"

#include <sstream>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/deviations.h"
#include "tinygpt/checks/faults.h"

namespace tinygpt::checks {

namespace {

// The production caches: the exact ones, then the low-precision ones (judged by a KL budget).
std::vector<const CacheVariant*> production_caches() {
  auto v = cache_registry().all(false);
  for (const auto* b : cache_registry().budgeted(false)) v.push_back(b);
  return v;
}

std::string code_list(const std::vector<std::string>& v) {
  std::vector<std::string> c;
  for (const auto& x : v) c.push_back("`" + x + "`");
  return join(c);
}

// A Markdown cell: pipes escaped, one line.
std::string cell(const std::string& s) {
  std::string o;
  for (char ch : s) o += ch == '|' ? std::string("\\|") : ch == '\n' ? std::string(" ") : std::string(1, ch);
  return o;
}

// The checks a fault's run makes: its own list, or the default set.
std::vector<std::string> runs_of(const CacheVariant& v) {
  return v.checks.empty() ? model_checks_with(static_cast<Tags>(Tag::Default)) : v.checks;
}

}  // namespace

nlohmann::json catalogue_json() {
  nlohmann::json checks = nlohmann::json::array(), sampler = nlohmann::json::array(), faults = nlohmann::json::array(),
                 devs = nlohmann::json::array();
  for (const auto& c : model_checks())
    checks.push_back({{"name", c.name}, {"proves", c.proves}, {"catches", c.catches}, {"judged_by", judge_text(c.judge)},
                      {"tags", tag_names(c.tags)}, {"cost", cost_name(c.cost)}, {"operation", c.ops.names()}});
  for (const auto& c : sampler_checks())
    sampler.push_back({{"name", c.name}, {"states", c.proves}, {"needs_scores", c.is(Tag::NeedsScores)}});
  for (const auto* v : fault_table()) {
    faults.push_back({{"name", v->name}, {"models", v->description}, {"seam", v->seam}, {"expected", v->expected},
                      {"runs", runs_of(*v)}, {"twins", v->twins}, {"remedy", v->remedy}});
    if (v->applies) faults.back()["feature"] = v->feature;  // a zoo fault: the members it runs on
  }
  for (const auto& d : known_deviations())
    devs.push_back({{"name", d.name}, {"what", d.what}, {"touches", d.touched()},
                    {"tolerance", d.tolerance ? nlohmann::json(*d.tolerance) : nlohmann::json(nullptr)},
                    {"self_tolerance", d.self_tolerance ? nlohmann::json(*d.self_tolerance) : nlohmann::json(nullptr)},
                    {"max_kl", d.max_kl ? nlohmann::json(*d.max_kl) : nlohmann::json(nullptr)},
                    {"voids", d.voids},
                    {"inside_window", d.inside_window},
                    {"evidence", d.evidence}});
  nlohmann::json caches = nlohmann::json::array();
  for (const auto* v : production_caches()) caches.push_back({{"name", v->name}, {"what", v->description}});
  return {{"checks", checks}, {"sampler", sampler}, {"faults", faults}, {"deviations", devs}, {"caches", caches}};
}

std::string catalogue_markdown() {
  std::ostringstream m;
  m << "### The model checks\n\n| check | a pass proves | a failure points to | judged by | tags | cost |\n"
       "| --- | --- | --- | --- | --- | --- |\n";
  for (const auto& c : model_checks())
    m << "| `" << c.name << "` | " << cell(c.proves) << " | " << cell(c.catches) << " | " << cell(judge_text(c.judge)) << " | "
      << cell(tag_names(c.tags)) << (c.ops.empty() ? "" : std::string(c.tags ? "; " : "") + "needs `" + c.ops.names() + "`") << " | " << cost_name(c.cost) << " |\n";
  m << "\n### The faults\n\nEach fault runs the checks in its last column; the matrix fails when a check in \"must be "
       "caught by\" misses it. Its seam is the file of `checks/src/faults/` its entry is in; its engine twins are the "
       "adapters' planted faults that are the same bug (`engines/<adapter>/faults.txt`), which a diagnosis of that "
       "engine must name it for.\n\n| fault | seam | models | must be caught by | its run | engine twins |\n"
       "| --- | --- | --- | --- | --- | --- |\n";
  const std::vector<std::string> default_set = model_checks_with(static_cast<Tags>(Tag::Default));
  for (const auto* v : fault_table()) {
    const auto runs = runs_of(*v);
    m << "| `" << v->name << "` | " << v->seam << " | " << cell(v->description) << " | " << code_list(v->expected)
      << (v->kv_budget ? " (by mean KL > " + sci(*v->kv_budget) + ")" : std::string())
      << (v->applies ? " on a zoo member with " + cell(v->feature) : std::string()) << " | "
      << (runs == default_set ? std::string("the default set") : code_list(runs)) << " | " << code_list(v->twins) << " |\n";
  }
  m << "\n### The deviations an engine may declare\n\n| deviation | what | rows it touches | judged at |\n"
       "| --- | --- | --- | --- |\n";
  for (const auto& d : known_deviations()) {
    std::string at = d.inside_window ? std::string("not judged: the run stays inside the window, as with `--no-past-window`")
                     : d.max_kl      ? "mean KL per step <= " + sci(*d.max_kl)
                     : d.tolerance ? "max \\|diff\\| <= " + sci(*d.tolerance)
                                   : std::string("a failure is reported as declared");
    if (d.self_tolerance) at += "; `self` at " + sci(*d.self_tolerance);
    if (!d.voids.empty()) at += "; a failure of " + code_list(d.voids) + " is reported as declared";
    m << "| `" << d.name << "` | " << cell(d.what) << " | " << code_list(d.touched()) << " | " << at << " |\n";
  }
  m << "\n### The sampler rows\n\nRows marked * read a sampler's filtered scores and are never run on an engine "
       "seen through `sample`.\n\n| row | states |\n| --- | --- |\n";
  for (const auto& c : sampler_checks())
    m << "| `" << c.name << "`" << (c.is(Tag::NeedsScores) ? " *" : "") << " | " << cell(c.proves) << " |\n";
  return m.str();
}

std::string catalogue_text() {
  std::ostringstream s;
  size_t w = 0;
  for (const auto& c : model_checks()) w = std::max(w, c.name.size());
  s << "model checks (default set marked *):\n";
  for (const auto& c : model_checks())
    s << "  " << (c.is(Tag::Default) ? "* " : "  ") << c.name << std::string(w + 2 - c.name.size(), ' ') << c.proves << "\n";
  s << "sampler rows: " << sampler_checks().size() << " (sampler/<law>; `tinygpt checks --markdown` lists them)\n";
  s << "faults:\n";
  for (const auto* v : fault_table())
    s << "  " << v->name << ": " << v->description << " (must be caught by " << join(v->expected)
      << (v->applies ? " on a zoo member with " + v->feature : std::string()) << ")\n";
  s << "deviations an engine may declare: " << deviation_names() << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
