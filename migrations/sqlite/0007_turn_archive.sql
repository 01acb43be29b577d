-- A chat's archived turns, one row per turn: `archive` is the chat's archive key (`relay-archive:<chat>`),
-- `turn_no` the turn's absolute index in the chat. A `fetchTurns` page reads its rows only, an operation on an
-- archived turn finds it by id, and no row grows with the chat (the single archive row of earlier releases
-- is moved here the next time its chat loads).
CREATE TABLE turn_archive (
    tenant  TEXT   NOT NULL,
    host    TEXT   NOT NULL,
    archive TEXT   NOT NULL,
    turn_no BIGINT NOT NULL,
    turn_id TEXT   NOT NULL,
    turn    TEXT   NOT NULL,
    PRIMARY KEY (tenant, host, archive, turn_no)
);
CREATE INDEX turn_archive_by_id ON turn_archive (tenant, host, archive, turn_id);
