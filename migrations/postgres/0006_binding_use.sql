-- When each clientId binding was last used (an initialize or reconnect with it, unix ms): bindings unused
-- past the retention are pruned with the old log rows, so clients cannot grow the table without bound.
-- Bindings made before this column existed count as used now.
ALTER TABLE client_bindings ADD COLUMN last_used_ms BIGINT NOT NULL DEFAULT 0;
UPDATE client_bindings SET last_used_ms = (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT;
CREATE INDEX client_bindings_by_use ON client_bindings (last_used_ms);
