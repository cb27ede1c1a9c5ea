#include "tinygpt/tools/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tinygpt/atomic_file.h"

namespace tinygpt::tools {

using namespace checks;

namespace {

std::string esc(const std::string& s) { return xml_escape(s); }

std::string num(double v, const char* f = "%.3g") {
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Okabe-Ito colours (distinct for colour-blind readers) with dash patterns, so the lines stay
// apart in greyscale too.
struct Style {
  const char* stroke;
  const char* dash;
  double width;
};
const Style kControl{"#000000", "", 2.2};
const Style kFaults[] = {{"#D55E00", "7 4", 1.8}, {"#0072B2", "2 3", 2.0}, {"#009E73", "10 3 2 3", 1.8},
                         {"#CC79A7", "4 2", 1.8}, {"#E69F00", "1 2", 2.2}, {"#56B4E9", "12 4", 1.6}};

struct Series {
  std::string label;
  int64_t first_position = 0;  // x of y[0]
  std::vector<double> y;
  Style style;
};

constexpr double kLogLo = -8, kLogHi = 2;  // 1e-8 .. 1e2 logit units

// A log-scale line plot of per-step logit differences against sequence position, with the
// tolerance line and the window edge marked.
std::string log_plot(const std::string& id, const std::string& title, const std::vector<Series>& series, int64_t context,
                     double tol, int W, int H, bool full_axes, const std::string& subtitle = "",
                     const std::string& y_label = "largest |logit difference| (logits, log scale)",
                     const std::string& tol_label = "tolerance", const std::vector<int64_t>& marks = {},
                     const std::string& marks_label = "") {
  // The subtitle on one line, or two split at a comma when it is long.
  std::vector<std::string> sub;
  if (!subtitle.empty()) {
    const size_t cut = subtitle.size() > 62 ? subtitle.rfind(", ", 62) : std::string::npos;
    if (cut == std::string::npos) sub = {subtitle};
    else sub = {subtitle.substr(0, cut + 1), subtitle.substr(cut + 2)};
  }
  const int L = full_axes ? 78 : 40, R = 12, B = full_axes ? 46 : 24;
  const int T = (full_axes ? 34 : 26) + 11 * static_cast<int>(sub.size());
  int64_t x0 = INT64_MAX, x1 = 0;
  for (const auto& s : series) {
    if (s.y.empty()) continue;
    x0 = std::min(x0, s.first_position);
    x1 = std::max<int64_t>(x1, s.first_position + static_cast<int64_t>(s.y.size()) - 1);
  }
  if (x0 == INT64_MAX) x0 = 0, x1 = 1;
  x1 = std::max(x1, std::min<int64_t>(context + 8, x1 + 1));
  auto X = [&](double x) { return L + (x - x0) / std::max<double>(1, x1 - x0) * (W - L - R); };
  auto Y = [&](double v) {
    const double l = std::clamp(std::log10(std::max(v, 1e-12)), kLogLo, kLogHi);
    return T + (kLogHi - l) / (kLogHi - kLogLo) * (H - T - B);
  };
  std::ostringstream s;
  s << "<svg id=\"" << esc(id) << "\" class=\"plot\" role=\"img\" aria-label=\"" << esc(title) << "\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  s << "<title>" << esc(title) << "</title>\n";
  s << "<text x=\"" << L << "\" y=\"" << (full_axes ? 18 : 14) << "\" class=\"ptitle\">" << esc(title) << "</text>\n";
  for (size_t i = 0; i < sub.size(); ++i)
    s << "<text x=\"" << L << "\" y=\"" << 26 + 10 * i << "\" class=\"sub\">" << esc(sub[i]) << "</text>\n";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"#fff\" stroke=\"#888\"/>\n";
  for (int e = static_cast<int>(kLogLo); e <= static_cast<int>(kLogHi); e += full_axes ? 1 : 2) {
    const double y = Y(std::pow(10.0, e));
    s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << y << "\" y2=\"" << y << "\" stroke=\"#e4e4e4\"/>"
      << "<text x=\"" << L - 4 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" class=\"tick\">1e" << e << "</text>\n";
  }
  const int64_t step = std::max<int64_t>(1, (x1 - x0) / (full_axes ? 8 : 3));
  for (int64_t x = x0; x <= x1; x += step)
    s << "<text x=\"" << X(x) << "\" y=\"" << H - B + 14 << "\" text-anchor=\"middle\" class=\"tick\">" << x << "</text>\n";
  // tolerance and window edge
  s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << Y(tol) << "\" y2=\"" << Y(tol)
    << "\" stroke=\"#555\" stroke-dasharray=\"3 3\"/><text x=\"" << W - R - 4 << "\" y=\"" << Y(tol) - 4
    << "\" text-anchor=\"end\" class=\"tick\">" << esc(tol_label) << " " << num(tol) << "</text>\n";
  if (context >= x0 && context <= x1)
    s << "<line x1=\"" << X(context) << "\" x2=\"" << X(context) << "\" y1=\"" << T << "\" y2=\"" << H - B
      << "\" stroke=\"#555\" stroke-dasharray=\"6 3\"/><text x=\"" << X(context) - 4 << "\" y=\"" << T + 12
      << "\" text-anchor=\"end\" class=\"tick\">window edge " << context << "</text>\n";
  for (const auto& sr : series) {
    if (sr.y.empty()) continue;
    s << "<polyline fill=\"none\" stroke=\"" << sr.style.stroke << "\" stroke-width=\"" << sr.style.width << "\"";
    if (*sr.style.dash) s << " stroke-dasharray=\"" << sr.style.dash << "\"";
    s << " points=\"";
    for (size_t i = 0; i < sr.y.size(); ++i)
      s << num(X(sr.first_position + static_cast<double>(i)), "%.1f") << "," << num(Y(sr.y[i]), "%.1f") << " ";
    s << "\"><title>" << esc(sr.label) << "</title></polyline>\n";
  }
  // Marked positions (a KV type's top-1 partings): red ticks along the bottom of the plot.
  for (int64_t m : marks)
    s << "<line class=\"mark\" x1=\"" << num(X(static_cast<double>(m)), "%.1f") << "\" x2=\"" << num(X(static_cast<double>(m)), "%.1f")
      << "\" y1=\"" << H - B - 10 << "\" y2=\"" << H - B << "\" stroke=\"#D55E00\" stroke-width=\"2\"><title>" << esc(marks_label) << " "
      << m << "</title></line>\n";
  if (full_axes) {
    s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\" class=\"axis\">"
      << "sequence position the step predicts from (tokens)</text>\n";
    s << "<text transform=\"translate(14," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\" class=\"axis\">"
      << esc(y_label) << "</text>\n";
    // legend, on a white box in the band between the faults (above) and the noise (below)
    double ly = Y(1e-1);
    s << "<rect x=\"" << L + 4 << "\" y=\"" << ly - 12 << "\" width=\"470\" height=\"" << 16 * series.size() + 8
      << "\" fill=\"#fff\" fill-opacity=\"0.92\" stroke=\"#bbb\"/>\n";
    for (const auto& sr : series) {
      s << "<line x1=\"" << L + 10 << "\" x2=\"" << L + 44 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\""
        << sr.style.stroke << "\" stroke-width=\"" << sr.style.width << "\"";
      if (*sr.style.dash) s << " stroke-dasharray=\"" << sr.style.dash << "\"";
      s << "/><text x=\"" << L + 50 << "\" y=\"" << ly + 4 << "\" class=\"legend\">" << esc(sr.label) << "</text>\n";
      ly += 16;
    }
  }
  s << "</svg>\n";
  return s.str();
}

// Horizontal bars, cached (solid) against uncached (hatched), per bench row.
std::string bench_chart(const nlohmann::json& bench) {
  const auto& rows = bench.at("rows");
  double top = 1;
  for (const auto& r : rows) top = std::max({top, r.value("cached_tok_s", 0.0), r.value("uncached_tok_s", 0.0)});
  const int L = 190, R = 90, bar = 12, gap = 10, W = 760;
  const int H = 40 + static_cast<int>(rows.size()) * (2 * bar + gap) + 40;
  std::ostringstream s;
  s << "<svg id=\"bench-chart\" class=\"plot\" role=\"img\" aria-label=\"tokens per second\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" xmlns=\"http://www.w3.org/2000/svg\">\n"
    << "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
    << "<rect width=\"6\" height=\"6\" fill=\"#fff\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#555\" stroke-width=\"2\"/>"
    << "</pattern></defs>\n"
    << "<text x=\"" << L << "\" y=\"18\" class=\"ptitle\">decode throughput (tokens per second, all rows of the batch)</text>\n";
  int y = 32;
  for (const auto& r : rows) {
    const std::string label = r.value("cache", std::string("?")) + ", batch " + std::to_string(r.value("batch", 0)) + ", " +
                              std::to_string(r.value("tokens", 0)) + " tokens";
    s << "<text x=\"" << L - 6 << "\" y=\"" << y + bar + 4 << "\" text-anchor=\"end\" class=\"tick\">" << esc(label) << "</text>\n";
    const double c = r.value("cached_tok_s", 0.0), u = r.value("uncached_tok_s", 0.0);
    s << "<rect x=\"" << L << "\" y=\"" << y << "\" width=\"" << std::max(1.0, c / top * (W - L - R)) << "\" height=\"" << bar
      << "\" fill=\"#0072B2\"><title>cached " << num(c, "%.0f") << " tok/s</title></rect><text x=\""
      << L + c / top * (W - L - R) + 4 << "\" y=\"" << y + bar - 2 << "\" class=\"tick\">" << num(c, "%.0f") << "</text>\n";
    if (u > 0)
      s << "<rect x=\"" << L << "\" y=\"" << y + bar << "\" width=\"" << std::max(1.0, u / top * (W - L - R)) << "\" height=\"" << bar
        << "\" fill=\"url(#hatch)\" stroke=\"#555\"><title>uncached " << num(u, "%.0f") << " tok/s</title></rect><text x=\""
        << L + u / top * (W - L - R) + 4 << "\" y=\"" << y + 2 * bar - 2 << "\" class=\"tick\">" << num(u, "%.0f") << "</text>\n";
    y += 2 * bar + gap;
  }
  s << "<rect x=\"" << L << "\" y=\"" << y + 8 << "\" width=\"14\" height=\"10\" fill=\"#0072B2\"/><text x=\"" << L + 20 << "\" y=\""
    << y + 17 << "\" class=\"legend\">cached</text><rect x=\"" << L + 90 << "\" y=\"" << y + 8
    << "\" width=\"14\" height=\"10\" fill=\"url(#hatch)\" stroke=\"#555\"/><text x=\"" << L + 110 << "\" y=\"" << y + 17
    << "\" class=\"legend\">uncached (the reference loop)</text>\n</svg>\n";
  return s.str();
}

struct Tally {
  int failed = 0, total = 0;
};
Tally tally(const std::vector<CheckResult>& rows) {
  Tally t;
  for (const auto& r : rows) t.failed += !r.ok(), ++t.total;
  return t;
}

const char* verdict_word(Status s) {
  return s == Status::Pass ? "PASS" : s == Status::Fail ? "FAIL" : s == Status::Error ? "ERROR" : "SKIP";
}

// "top-1 99.6%, KL 1.2e-07" for a row with precision statistics, else "".
std::string precision(const CheckResult& r) {
  if (!r.stats.count("top1_agreement")) return "";
  char b[96];
  std::snprintf(b, sizeof b, "top-1 %.1f%%, KL mean %.1e, max %.1e", 100 * r.stats.at("top1_agreement"),
                r.stats.count("kl_mean") ? r.stats.at("kl_mean") : 0.0, r.stats.count("kl_max") ? r.stats.at("kl_max") : 0.0);
  return b;
}

std::string verdict(const ReportInput& in) {
  const Tally t = tally(in.rows);
  return t.failed ? "FAIL: " + std::to_string(t.failed) + " of " + std::to_string(t.total) + " checks failed"
                  : "PASS: all " + std::to_string(t.total) + " checks passed";
}

std::string drift_text(const FaultOutcome& f) {
  if (!f.drift_measured) return "-";
  return f.drift_after ? std::to_string(*f.drift_after) : "never in " + std::to_string(f.drift_window);
}

// The matrix cell's class: the cells a reader must look at stand out.
const char* cell_class(const MatrixCell& c) {
  if (c.kind == MatrixCell::Caught) return c.expected ? "must" : "also";
  if ((c.kind == MatrixCell::Missed || c.kind == MatrixCell::Error) && c.expected) return "FAIL";
  return "none";
}

const char* const kStyle =
    "body{font:14px/1.45 system-ui,-apple-system,'DejaVu Sans',sans-serif;margin:24px auto;max-width:1180px;color:#111;padding:0 16px}\n"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccc}\n"
    ".verdict{font-size:18px;font-weight:700;padding:8px 12px;border:2px solid;display:inline-block;margin:8px 0}\n"
    ".pass{border-color:#0072B2}.fail{border-color:#D55E00;background:#fff3ea}\n"
    "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #bbb;padding:3px 7px;text-align:left;vertical-align:top}\n"
    "th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    "td.FAIL{font-weight:700;background:#ffe3d1}td.must{font-weight:700}td.none{color:#777}\n"
    ".ptitle{font-size:13px;font-weight:600}.tick{font-size:10px;fill:#333}.axis{font-size:12px}.legend{font-size:11px}.sub{font-size:9px;fill:#333}\n"
    ".grid{display:flex;flex-wrap:wrap;gap:6px}pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}\n"
    ".note{color:#444;font-size:13px}\n";

// A header row of plain words.
std::string header_row(const std::vector<std::string>& cells) {
  std::string s = "<tr>";
  for (const auto& c : cells) s += "<th>" + esc(c) + "</th>";
  return s + "</tr>\n";
}

// A cell of escaped text with a class.
std::string td(const std::string& cls, const std::string& text) { return "<td class=\"" + cls + "\">" + esc(text) + "</td>"; }
std::string td(const std::string& text) { return "<td>" + esc(text) + "</td>"; }

// The per-step plot of the correct caches and the seed's faults, then one small plot per fault.
std::string drift_plots(const ReportInput& in) {
  const InjectionReport* inj = in.injection;
  std::ostringstream h;
  std::vector<Series> main;
  auto add_control = [&](const EquivalenceResult& c) {
    Style st = kControl;
    if (!main.empty()) st = {"#666666", "1 0", 1.4};
    main.push_back({"correct cache '" + c.cache + "' (production loop vs banded reference)", c.loop_band.first_position,
                    c.loop_band.diffs, st});
  };
  if (inj)
    for (const auto& c : inj->controls) add_control(c);
  if (in.single) add_control(*in.single);
  size_t k = 0;
  if (inj)
    for (const auto& f : inj->faults)
      if (f.seed_drift)
        main.push_back({"fault '" + f.fault + "'", main.empty() ? 0 : main.front().first_position, f.step_diffs, kFaults[k++ % 6]});
  h << "<h2>Per-step logit difference</h2>\n<p class=\"note\">Every decode step of the production loop against the "
       "banded (rolling-cache) reference of SPEC 4: the correct caches sit at float noise, a fault jumps by orders of "
       "magnitude at its first decode step.</p>\n";
  h << log_plot("drift-plot", "largest |logit difference| per step", main, in.context, in.tolerance, 1120, 400, true);
  if (!inj || inj->faults.empty()) return h.str();
  h << "<h2>Every fault against the correct cache</h2>\n<p class=\"note\">Solid black: the correct cache '"
    << esc(inj->controls.empty() ? std::string("?") : inj->controls.front().cache)
    << "'. Dashed orange: the fault's main run. A fault that only shows in another run (reset, batch, long prompt) "
       "stays on the black line here; its title names the checks that caught it.</p>\n<div id=\"fault-plots\" class=\"grid\">\n";
  for (const auto& f : inj->faults) {
    std::vector<Series> s;
    if (!inj->controls.empty()) {
      const auto& c = inj->controls.front();
      std::vector<double> y(c.loop_band.diffs.begin(),
                            c.loop_band.diffs.begin() + std::min(c.loop_band.diffs.size(), f.step_diffs.size() + 1));
      s.push_back({"correct", c.loop_band.first_position, y, kControl});
    }
    s.push_back({f.fault, s.empty() ? 0 : s.front().first_position, f.step_diffs, kFaults[0]});
    std::string by;
    for (const auto& c : f.checks)
      if (c.failed()) by += (by.empty() ? "" : ", ") + c.name;
    h << log_plot("fault-" + f.fault, f.fault, s, in.context, in.tolerance, 370, 190, false, by.empty() ? "NOT CAUGHT" : "caught by " + by);
  }
  h << "</div>\n";
  return h.str();
}

// Each KV cache type's cost per position: KL against the same engine with an fp32 cache and against
// our model, the budget line, the window edge, and a tick where the top-1 parts from the fp32-cache run.
std::string kv_section(const ReportInput& in) {
  std::ostringstream h;
  h << "<h2>What each KV cache or weight type costs, per position</h2>\n<p class=\"note\">The teacher-forced run (the reference's "
       "sequence fed to every type) through the engine with each cache or weight type: KL(baseline || type) per step against the "
       "same target at fp32 (solid: only that precision differs) and against our fp32 model (dashed). The "
       "dotted line is the budget the row is judged by; red ticks mark positions whose argmax parts from the baseline's. "
       "Inside and past the window, so a drift that starts late is visible at a glance.</p>\n";
  for (const auto& k : *in.kv) {
    std::vector<Series> s;
    if (!k.baseline.empty()) s.push_back({"vs the same target with " + k.baseline_words(), k.vs_baseline.first_position, k.vs_baseline.kl, kControl});
    s.push_back({"vs our fp32 model", k.vs_model.first_position, k.vs_model.kl, kFaults[0]});
    const checks::StepDiffs& d = k.judged();
    std::vector<int64_t> parted;
    for (size_t i = 0; i < d.top1.size(); ++i)
      if (!d.top1[i]) parted.push_back(d.first_position + static_cast<int64_t>(i));
    const std::string sub = std::string(k.passed() ? "PASS" : "FAIL") + ": mean KL " + num(d.kl_mean()) + ", p99 " + num(checks::kl_p99(d)) +
                            ", max " + num(d.kl_max()) + ", top-1 " + num(100.0 * d.top1_agreement(), "%.1f") + "%";
    h << log_plot(k.kind + "-" + k.kv_type, k.what() + ": KL per step", s, in.context, k.budget, 1120, 300, true, sub,
                  "KL per step (nats, log scale)", "budget", parted, "top-1 parts from the baseline at position");
  }
  h << "<table class=\"kv\">" << header_row({"type", "against", "mean KL", "p99 KL", "max KL", "top-1", "first parting", "worst |diff|", "verdict"});
  for (const auto& k : *in.kv) {
    auto row = [&](const std::string& against, const checks::StepDiffs& d, bool judged) {
      h << "<tr>" << td(k.what()) << td(against) << td(num(d.kl_mean())) << td(num(checks::kl_p99(d))) << td(num(d.kl_max()))
        << td(num(100.0 * d.top1_agreement(), "%.1f") + "%") << td(d.first_top1_parting ? std::to_string(*d.first_top1_parting) : "never")
        << td(num(d.worst)) << (judged ? td(k.passed() ? "pass" : "fail", k.passed() ? "PASS" : "FAIL") : td("")) << "</tr>\n";
    };
    if (!k.baseline.empty()) row("same target, " + k.baseline_words(), k.vs_baseline, true);
    row("our fp32 model", k.vs_model, k.baseline.empty());
  }
  h << "</table>\n";
  return h.str();
}

// Token drift against the seed's figures, then the detection matrix.
std::string matrix_section(const InjectionReport& inj) {
  std::ostringstream h;
  h << "<h2>Token drift (100 greedy tokens against the correct cached output)</h2>\n<table id=\"drift-table\">"
    << header_row({"fault", "identical tokens before drifting", "the seed's figure", "first logit step over tolerance", "worst |diff|"});
  for (const auto& f : inj.faults)
    h << "<tr>" << td(f.fault) << td("num", drift_text(f)) << td("num", f.seed_drift ? std::to_string(*f.seed_drift) : "-")
      << td("num", f.first_logit_position_over ? "position " + std::to_string(*f.first_logit_position_over) : "-")
      << td("num", num(f.worst_logit_diff)) << "</tr>\n";
  h << "</table>\n";
  const FaultMatrix m = fault_matrix(inj);
  const size_t observable = static_cast<size_t>(inj.observable()), inert = inj.faults.size() - observable;
  h << "<h2>Detection matrix</h2>\n<p id=\"mutation-score\"><b>Mutation score: " << inj.caught() << " of " << observable
    << " faults caught (" << num(100.0 * inj.caught() / std::max<size_t>(1, observable), "%.0f") << "%)</b>"
    << (inert ? esc("; " + std::to_string(inert) + " not observable on this model (their effect within its own noise: neither caught nor missed)")
              : std::string())
    << "</p>\n"
    << "<p class=\"note\">" << esc(kMatrixLegend) << "</p>\n<table id=\"detection-matrix\">";
  std::vector<std::string> head = {"fault"};
  head.insert(head.end(), m.checks.begin(), m.checks.end());
  head.push_back("what it breaks");
  h << header_row(head);
  for (size_t i = 0; i < m.faults.size(); ++i) {
    h << "<tr>" << td(m.faults[i]->fault);
    for (const auto& c : m.cells[i]) h << td(cell_class(c), cell_symbol(c));
    h << td("note", m.faults[i]->description) << "</tr>\n";
  }
  h << "</table>\n";
  return h.str();
}

// The summary table, goldens apart with their diffs.
std::string checks_section(const std::vector<CheckResult>& rows) {
  std::ostringstream h;
  h << "<h2>Checks</h2>\n<table id=\"checks-table\">" << header_row({"check", "verdict", "time (s)", "key figure", "bound", "precision"});
  std::vector<const CheckResult*> goldens;
  for (const auto& r : rows) {
    if (r.name.rfind("golden:", 0) == 0) {
      goldens.push_back(&r);
      continue;
    }
    h << "<tr>" << td(r.name) << td(verdict_word(r.status), verdict_word(r.status)) << td("num", num(r.seconds, "%.1f"))
      << td(r.detail) << td(r.bound) << td(precision(r)) << "</tr>\n";
  }
  h << "</table>\n";
  if (goldens.empty()) return h.str();
  h << "<h2>Goldens</h2>\n<table id=\"golden-table\">" << header_row({"case", "verdict", "detail"});
  for (const auto* r : goldens)
    h << "<tr>" << td(r->name.substr(7)) << td(verdict_word(r->status), verdict_word(r->status))
      << (r->ok() ? td(r->detail) : "<td><pre>" + esc(r->detail) + "</pre></td>") << "</tr>\n";
  h << "</table>\n";
  return h.str();
}

std::string bench_section(const nlohmann::json& bench) {
  std::ostringstream h;
  h << "<h2>Benchmark</h2>\n";
  if (!bench.is_object() || !bench.contains("rows"))
    return h.str() + "<p id=\"bench-missing\" class=\"note\">Not part of this run: <code>tinygpt bench --json B.json</code>, then "
                     "<code>--bench-json B.json</code> adds its table and chart here.</p>\n";
  h << "<table id=\"bench-table\">" << header_row({"cache", "batch", "tokens", "uncached tok/s", "cached tok/s", "speedup"});
  for (const auto& r : bench["rows"])
    h << "<tr>" << td(r.value("cache", std::string("?"))) << td("num", std::to_string(r.value("batch", 0)))
      << td("num", std::to_string(r.value("tokens", 0))) << td("num", num(r.value("uncached_tok_s", 0.0), "%.0f"))
      << td("num", num(r.value("cached_tok_s", 0.0), "%.0f")) << td("num", num(r.value("speedup", 0.0), "%.1fx")) << "</tr>\n";
  h << "</table>\n" << bench_chart(bench);
  return h.str();
}

std::string provenance_section(const ReportInput& in) {
  auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  std::ostringstream h;
  h << "<h2>Provenance</h2>\n<table id=\"provenance\">";
  if (in.provenance.is_object())
    for (const auto& [k, v] : in.provenance.items()) h << "<tr><th>" << esc(k) << "</th>" << td(text(v)) << "</tr>";
  if (in.bench.is_object() && in.bench.contains("machine"))
    for (const auto& [k, v] : in.bench["machine"].items()) h << "<tr><th>bench " << esc(k) << "</th>" << td(text(v)) << "</tr>";
  h << "</table>\n";
  return h.str();
}

}  // namespace

std::string render_html(const ReportInput& in) {
  std::ostringstream h;
  const Tally t = tally(in.rows);
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>tinygpt " << esc(in.command) << ": "
    << esc(verdict(in)) << "</title>\n<style>\n" << kStyle << "</style></head><body>\n";
  h << "<h1>tinygpt " << esc(in.command) << "</h1>\n<div class=\"note\">" << esc(in.subject) << "</div>\n";
  h << "<div id=\"verdict\" class=\"verdict " << (t.failed ? "fail" : "pass") << "\">" << esc(verdict(in)) << "</div>\n";
  if (in.injection || in.single) h << drift_plots(in);
  if (in.injection && !in.injection->faults.empty()) h << matrix_section(*in.injection);
  if (in.kv && !in.kv->empty()) h << kv_section(in);
  h << checks_section(in.rows) << bench_section(in.bench) << provenance_section(in) << "</body></html>\n";
  return h.str();
}

std::string render_markdown(const ReportInput& in) {
  std::ostringstream m;
  const Tally t = tally(in.rows);
  m << (t.failed ? "**FAIL**" : "**PASS**") << " tinygpt " << in.command << ": " << verdict(in).substr(6) << "\n\n";
  if (!in.subject.empty()) m << in.subject << "\n\n";
  m << markdown_table(in.rows);
  if (in.injection && !in.injection->faults.empty()) {
    const FaultMatrix fm = fault_matrix(*in.injection);
    const size_t inert = in.injection->faults.size() - static_cast<size_t>(in.injection->observable());
    m << "\n**Detection matrix**: mutation score " << in.injection->caught() << " of " << in.injection->observable()
      << " faults caught" << (inert ? " (the observable ones; " + std::to_string(inert) + " not observable on this model)" : std::string()) << ". "
      << kMatrixLegend << "\n\n| fault | drift after (seed) |";
    for (const auto& n : fm.checks) m << " " << n << " |";
    m << "\n|---|---|";
    for (size_t i = 0; i < fm.checks.size(); ++i) m << "---|";
    m << "\n";
    for (size_t i = 0; i < fm.faults.size(); ++i) {
      const FaultOutcome& f = *fm.faults[i];
      m << "| " << f.fault << " | " << drift_text(f) << (f.seed_drift ? " (" + std::to_string(*f.seed_drift) + ")" : "") << " |";
      for (const auto& c : fm.cells[i]) m << " " << cell_symbol(c) << " |";
      m << "\n";
    }
  }
  if (in.kv && !in.kv->empty()) {
    m << "\n**What each KV cache or weight type costs, per position** (teacher-forced; KL(baseline || type) per step, mean over each span)\n";
    for (const auto& k : *in.kv) {
      const checks::StepDiffs& d = k.judged();
      m << "\n" << k.what() << ": " << (k.passed() ? "PASS" : "FAIL") << ", mean KL " << num(d.kl_mean()) << " against "
        << (k.baseline.empty() ? std::string("our fp32 model") : "the same target with " + k.baseline_words()) << " (budget "
        << num(k.budget) << "), p99 " << num(checks::kl_p99(d)) << ", max " << num(d.kl_max()) << ", top-1 "
        << num(100.0 * d.top1_agreement(), "%.1f") << "%, first parting "
        << (d.first_top1_parting ? std::to_string(*d.first_top1_parting) : std::string("never")) << "\n\n| positions | mean KL | max KL | top-1 |"
        << (k.baseline.empty() ? "" : " mean KL vs our model |") << "\n|---|---:|---:|---:|" << (k.baseline.empty() ? "" : "---:|") << "\n";
      const size_t n = d.kl.size(), span = 50;
      for (size_t a = 0; a < n; a += span) {
        const size_t b = std::min(n, a + span);
        double sum = 0, mx = 0, model = 0;
        size_t agree = 0;
        for (size_t i = a; i < b; ++i) {
          sum += d.kl[i], mx = std::max(mx, d.kl[i]), agree += d.top1[i] ? 1 : 0;
          if (i < k.vs_model.kl.size()) model += k.vs_model.kl[i];
        }
        const double c = static_cast<double>(b - a);
        m << "| " << d.first_position + static_cast<int64_t>(a) << "-" << d.first_position + static_cast<int64_t>(b) - 1 << " | " << num(sum / c)
          << " | " << num(mx) << " | " << num(100.0 * static_cast<double>(agree) / c, "%.1f") << "% |"
          << (k.baseline.empty() ? "" : " " + num(model / c) + " |") << "\n";
      }
    }
  }
  if (in.bench.is_object() && in.bench.contains("rows")) {
    m << "\n**Benchmark**\n\n| cache | batch | tokens | uncached tok/s | cached tok/s | speedup |\n|---|---:|---:|---:|---:|---:|\n";
    for (const auto& r : in.bench["rows"])
      m << "| " << r.value("cache", std::string("?")) << " | " << r.value("batch", 0) << " | " << r.value("tokens", 0) << " | "
        << num(r.value("uncached_tok_s", 0.0), "%.0f") << " | " << num(r.value("cached_tok_s", 0.0), "%.0f") << " | "
        << num(r.value("speedup", 0.0), "%.1fx") << " |\n";
  }
  if (in.provenance.is_object()) {
    m << "\n";
    for (const auto& [k, v] : in.provenance.items()) m << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "; ";
    m << "\n";
  }
  return m.str();
}

}  // namespace tinygpt::tools
