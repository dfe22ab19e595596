"""The caches a run reads instead of recomputing: features extracted once and reused by every
task and rerun, and the decoded evaluation views a second backbone reads instead of decoding.
Their files, checks and keys live one floor down, in ``evalkit.storage``.

Modules: ``settings`` (what an extraction is asked for: the features and how they are
computed and kept), ``keys`` (the key of a feature entry), ``extraction`` (the extraction loop
and what it writes), ``feed`` (where its images come from: the pixel cache, or decoded),
``feature_set`` (the features of a split, read back one shard at a time), ``entries`` (the
entries `evalkit cache` lists, verifies and clears) and ``pixels`` (the pixel cache)."""
