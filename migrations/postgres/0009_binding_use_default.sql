-- Bindings written by a shard of the release before 0006 (still running during a rolling upgrade) do not name
-- their use: they take "now" as their last use, not 0, so the next prune does not take them for stale. A
-- default is a catalog change: no row is rewritten and the table is locked only for that instant. Rows
-- already at 0 are stamped by the prune itself, in batches (`relay_store::bindings`).
ALTER TABLE client_bindings ALTER COLUMN last_used_ms SET DEFAULT ((EXTRACT(EPOCH FROM now()) * 1000)::BIGINT);
