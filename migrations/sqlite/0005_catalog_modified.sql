-- listSessions lists the most recently modified sessions first (AHP: SHOULD be newest first by
-- modification). `modified_at` is the summary's modifiedAt, formatted by the shard so that text order is time
-- order; ties go to the newer catalogue number.
ALTER TABLE catalog ADD COLUMN modified_at TEXT NOT NULL DEFAULT '';
UPDATE catalog SET modified_at = created_at;
CREATE INDEX catalog_by_modified ON catalog (tenant, host, modified_at, catalog_no);
