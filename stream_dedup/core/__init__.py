"""The detector's pure core: text -> sketch -> match.

No RocksDB, no Kafka, no clock: every function here is a function of its arguments, so the
offline command, the service and the tests share one behaviour. A document's path through
it, one module per step:

- :mod:`.normalize` (NFKC, casefold, whitespace) -> :mod:`.shingles` (hashed k-grams) ->
  :mod:`.signature` (one-permutation MinHash) -> :mod:`.bands` (LSH bands and rows) ->
  :mod:`.lookup_keys` (the keys a document is looked up under) -> :mod:`.verify` (verification
  sets, exact Jaccard) -> :mod:`.match` (a batch's candidates verified, the match chosen).
- :mod:`.sketch` runs the steps up to the band keys for a whole batch; for character
  shingles it takes the compiled path of :mod:`._kernels`, which gives bit for bit what the
  step modules give (the tests hold one against the other).
- :mod:`.jit` decides whether a batch runs the kernels compiled by numba or as the same
  functions in Python (a small batch: no numba to load).
- :mod:`.config` holds the detector's parameters.
"""
