// The series' Part 3 checkpoints both ways: torch.save({"model": state_dict, "config": {...},
// "step": N}) in PyTorch's zip format (SPEC 8). The zip is read and written with LibTorch's own
// reader and writer; the pickle is read by a restricted unpickler that accepts only what torch.save
// emits for these files and refuses any other global by name (so loading never executes code), and
// written with exactly those opcodes, so Python's torch.load reads our files too.
// Leaves out TorchScript archives and legacy (pre-1.6, non-zip) torch.save files.
#pragma once

#include <string>

#include "tinygpt/checkpoint.h"

namespace tinygpt {

// Reads a .pt file (torch_checkpoint.cpp). Throws InputError naming the problem (bad zip, refused
// global, unsupported dtype, malformed structure).
Checkpoint read_torch_checkpoint(const std::string& path);

// Writes one atomically (torch_checkpoint_writer.cpp): {"model": OrderedDict, "config": dict,
// "step": int}, pickle protocol 2, the tied head sharing emb's storage.
void write_torch_checkpoint(const std::string& path, const Checkpoint& ck);

}  // namespace tinygpt
