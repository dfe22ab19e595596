"""What evalkit keeps on disk and how it is named: the ground floor every cache, reader and
writer stands on. It imports only ``evalkit.errors``.

Modules: ``writes`` (atomic and appending writes, locks, disk errors), ``checkpoints`` (read,
weights id, shape check, save, shard index), ``shards`` (the cache's shard format, its checks
and the entries derived from damaged ones) and ``identity`` (content ids of files, folders and
weights, library versions, and the one way a spec becomes a key)."""
