-- Renewing every lease of one owner in one statement (a shard's lease keeper, once per third of the TTL)
-- finds them by owner instead of scanning every lease ever taken.
CREATE INDEX leases_by_owner ON leases (owner);
