-- Content by reference: file edits' sides, large tool outputs and images an agent produced, kept out of the
-- state tree (which names them by `ahp-content:/<id>` URIs, served by `resourceRead`). `owner` is the session
-- they belong to: they are deleted with it. `data` is base64.
CREATE TABLE contents (
    tenant       TEXT   NOT NULL,
    host         TEXT   NOT NULL,
    id           TEXT   NOT NULL,
    owner        TEXT   NOT NULL,
    content_type TEXT   NOT NULL,
    data         TEXT   NOT NULL,
    PRIMARY KEY (tenant, host, id)
);
CREATE INDEX contents_by_owner ON contents (tenant, host, owner);
