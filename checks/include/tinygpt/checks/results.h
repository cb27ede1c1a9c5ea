// The harness's rows are the results layer's (tinygpt/results/result.h): its type, verdicts and
// printers, named in the harness without a prefix - each name brought in by itself, so the harness
// sees what the results layer offers and nothing it may add later.
#pragma once

#include "tinygpt/results/result.h"

namespace tinygpt::checks {
using results::all_ok;
using results::CheckResult;
using results::error_result;
using results::format_table;
using results::join;
using results::junit_xml;
using results::markdown_table;
using results::sci;
using results::Status;
using results::status_from_string;
using results::to_json;
using results::to_string;
using results::utf8_char;
using results::worst;
using results::write_json_atomically;
using results::xml_escape;
}  // namespace tinygpt::checks
