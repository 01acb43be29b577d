-- The embedded store has one writer, this process: no release before 0006 writes bindings beside it, and rows
-- at 0 are stamped by the prune itself (`relay_store::bindings`). Nothing to change in the schema; the number
-- keeps both stores' migrations in step.
SELECT 1;
