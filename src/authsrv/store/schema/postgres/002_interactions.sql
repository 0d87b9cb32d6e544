-- authsrv PostgreSQL schema, version 2.
--
-- A sign-in in progress is an interaction with typed columns (the request
-- it carries, flattened), replacing the pending request's JSON parameters;
-- a chat-account link in progress is a link attempt. Clients name the
-- grants they may use; existing clients keep the two they could use before.

CREATE TABLE interactions (
    interaction_id TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    client_id TEXT NOT NULL,
    redirect_uri TEXT NOT NULL,
    scope TEXT NOT NULL,
    state TEXT NOT NULL,
    code_challenge TEXT NOT NULL,
    nonce TEXT,
    resources TEXT[] NOT NULL,
    prompt TEXT NOT NULL,
    max_age BIGINT,
    login_hint TEXT,
    csrf_token TEXT NOT NULL,
    sid TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX interactions_expires_at ON interactions (expires_at);

CREATE TABLE link_attempts (
    state_hash TEXT PRIMARY KEY,
    sub TEXT NOT NULL,
    session_hash TEXT NOT NULL,
    code_verifier TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX link_attempts_expires_at ON link_attempts (expires_at);

DROP TABLE pending_authorizations;

ALTER TABLE clients ADD COLUMN grant_types TEXT[] NOT NULL DEFAULT '{authorization_code,refresh_token}';
ALTER TABLE clients ALTER COLUMN grant_types DROP DEFAULT;
