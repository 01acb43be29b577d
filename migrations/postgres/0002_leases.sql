-- Host ownership leases (Postgres), design §3 and invariant 6: which owner (a shard) holds each host,
-- until when, and under which fencing epoch. A table of its own rather than columns of `hosts`: the
-- `hosts` row is the lock every commit and compaction of the host takes, and lease traffic (renewals,
-- other shards trying to take a host over, placement scans) must neither queue behind compactions nor
-- hold up commits any longer than the fencing check needs. Keyed by (tenant, host), as everything else.
CREATE TABLE leases (
    tenant        TEXT   NOT NULL,
    host          TEXT   NOT NULL,
    -- the owner holding the lease; NULL once it was released (the host is free)
    owner         TEXT,
    -- the fencing epoch: 1 for the first owner, +1 at every change of owner, never reset (a released
    -- lease keeps its epoch; the next acquire increments it)
    epoch         BIGINT NOT NULL,
    -- unix ms at which the lease lapses unless renewed (held while expires_at_ms > now); 0 once released
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, host)
);
-- placement: free and expired leases, most overdue first
CREATE INDEX leases_by_expiry ON leases (expires_at_ms);
