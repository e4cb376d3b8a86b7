"""Upper bounds on what a user may ask for: every value that sizes memory or reaches native code.

The config schema states the same numbers (a test keeps them equal). Each bound is far
above what this tool's evidence needs and far below what would exhaust a machine.
"""

MAX_SESSIONS = 100_000  # sessions in a workload, or an admit --burst
MAX_ENDPOINT_SESSIONS = 512  # sessions of an endpoint sweep: each pass that sends all at once has a thread each
MAX_LEVELS = 64  # concurrency levels in one sweep, and entries of any list flag
MAX_TOKENS = 1 << 20  # prompt or new tokens of one session (the model's context bounds it further)
MAX_THREADS = 512  # GGML_MAX_N_THREADS: llama.cpp crashes beyond it
MAX_BENCH_BATCH = 512  # rows of a benchmark batch (synthetic engine and layouts)
MAX_LLAMA_SEQUENCES = 256  # LLAMA_MAX_SEQ: sequences of one llama.cpp context
MAX_BYTES = 1 << 50  # any byte budget (1 PiB)
