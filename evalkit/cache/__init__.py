"""The caches a run reads instead of recomputing: features extracted once and reused by every
task and rerun, and the decoded evaluation views a second backbone reads instead of decoding.
Their files, checks and keys live one floor down, in ``evalkit.storage``.

Modules: ``features`` (extraction and the feature cache) and ``pixels`` (the pixel cache)."""
