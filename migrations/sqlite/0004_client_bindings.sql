-- Which user (token subject) a host's AHP clientId belongs to: the first subject that used it. Kept across
-- restarts so that after one nobody else can claim another user's clientId (and with it their pending tool
-- calls, input requests and active-client slots).
CREATE TABLE client_bindings (
    tenant TEXT NOT NULL,
    host TEXT NOT NULL,
    client_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    PRIMARY KEY (tenant, host, client_id)
);
