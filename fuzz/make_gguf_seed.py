# usage: python3 fuzz/make_gguf_seed.py fuzz/corpus/gguf/tiny.gguf
# A tiny GGUF v3 file as write_gguf lays one out: two metadata values, two F32 tensors.
import struct, sys
def s(x): b = x.encode(); return struct.pack("<Q", len(b)) + b
kv = s("general.architecture") + struct.pack("<I", 8) + s("gptneox")
kv += s("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", 32)
kv += s("gptneox.rope.freq_base") + struct.pack("<I", 6) + struct.pack("<f", 10000.0)
kv += s("gptneox.use_parallel_residual") + struct.pack("<I", 7) + b"\x00"
kv += s("general.file_type") + struct.pack("<I", 10) + struct.pack("<Q", 0)
infos = s("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 3) + struct.pack("<I", 0) + struct.pack("<Q", 0)
infos += s("output_norm.bias") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<I", 0) + struct.pack("<Q", 64)
head = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", 2, 5) + kv + infos
head += b"\0" * ((-len(head)) % 32)
data = struct.pack("<12f", *[i / 8 for i in range(12)]) + b"\0" * 16 + struct.pack("<4f", 1, 2, 3, 4)
open(sys.argv[1], "wb").write(head + data)
