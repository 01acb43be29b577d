-- The relay's durable store (Postgres). Every table is keyed by (tenant, host, …): two tenants may use the
-- same host names and channel URIs and never see each other's rows. JSON is kept as TEXT, written and read
-- verbatim, never parsed by the database.

-- One row per host: its durable counters.
CREATE TABLE hosts (
    tenant          TEXT   NOT NULL,
    host            TEXT   NOT NULL,
    -- highest serverSeq ever committed for the host (logged or not)
    last_seq        BIGINT NOT NULL DEFAULT 0,
    -- highest serverSeq removed from the log by compaction (0: nothing removed)
    log_floor       BIGINT NOT NULL DEFAULT 0,
    -- 1 + the highest catalog_no ever used by the host (numbers are never reused)
    next_catalog_no BIGINT NOT NULL DEFAULT 1,
    PRIMARY KEY (tenant, host)
);

-- The action log: one row per committed envelope, in the host's one serverSeq space.
CREATE TABLE log (
    tenant   TEXT   NOT NULL,
    host     TEXT   NOT NULL,
    seq      BIGINT NOT NULL,
    channel  TEXT   NOT NULL,
    envelope TEXT   NOT NULL,
    at_ms    BIGINT NOT NULL,
    PRIMARY KEY (tenant, host, seq)
);
-- a channel's tail after its snapshot, and replay of a set of channels
CREATE INDEX log_by_channel ON log (tenant, host, channel, seq);
-- retention: finding rows older than the cut-off without scanning the whole log
CREATE INDEX log_by_age ON log (at_ms);

-- The latest snapshot of each live channel; chats name their session as parent.
CREATE TABLE snapshots (
    tenant  TEXT   NOT NULL,
    host    TEXT   NOT NULL,
    channel TEXT   NOT NULL,
    parent  TEXT,
    seq     BIGINT NOT NULL,
    state   TEXT   NOT NULL,
    PRIMARY KEY (tenant, host, channel)
);
CREATE INDEX snapshots_by_parent ON snapshots (tenant, host, parent);

-- The sessions catalogue behind listSessions: newest first by catalog_no.
CREATE TABLE catalog (
    tenant     TEXT   NOT NULL,
    host       TEXT   NOT NULL,
    uri        TEXT   NOT NULL,
    catalog_no BIGINT NOT NULL,
    created_at TEXT   NOT NULL,
    summary    TEXT   NOT NULL,
    PRIMARY KEY (tenant, host, uri)
);
CREATE UNIQUE INDEX catalog_by_number ON catalog (tenant, host, catalog_no);
