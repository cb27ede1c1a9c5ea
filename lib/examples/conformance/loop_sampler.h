// A sampler of this project's own: SPEC 6 written as plain loops over each row on the CPU, with
// LibTorch only for the final draw (so a seed reproduces its draws).
#pragma once

#include <ATen/ATen.h>
#include <tinygpt/sampler.h>

// logits (B, V), history (B, T) or undefined -> (B, V) scores the draw uses, -inf where dropped.
at::Tensor loop_filtered(const at::Tensor& logits, const at::Tensor& history, const tinygpt::SamplingSettings& s);
// -> (B) ids; temperature 0 = argmax after the penalty (first index on ties).
at::Tensor loop_pick(const at::Tensor& logits, const at::Tensor& history, const tinygpt::SamplingSettings& s);
