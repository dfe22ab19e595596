"""The feature cache (``features``: extracted once, reused by every task and rerun) and the
identities its keys and the run keys are made of (``identity``: files, specs, libraries)."""
