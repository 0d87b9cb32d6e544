-- authsrv PostgreSQL schema, version 1.
--
-- The same tables as the SQLite store. Tokens, codes and session ids are
-- stored only as SHA-256 hex digests. Times are integer seconds since the
-- epoch; a row whose expires_at (or until) equals now has expired. Scopes
-- are space-separated, lists of URIs are text arrays, provider tokens and
-- refresh replays are bytea (already encrypted by the caller).

CREATE TABLE clients (
    client_id TEXT PRIMARY KEY,
    secret_hash TEXT,
    redirect_uris TEXT[] NOT NULL,
    post_logout_redirect_uris TEXT[] NOT NULL,
    name TEXT NOT NULL,
    end_session_enabled BOOLEAN NOT NULL,
    first_party BOOLEAN NOT NULL,
    resources TEXT[] NOT NULL,
    introspect_any BOOLEAN NOT NULL,
    backchannel_logout_uri TEXT,
    created_at BIGINT NOT NULL
);

CREATE TABLE browser_sessions (
    session_hash TEXT PRIMARY KEY,
    sid TEXT NOT NULL,
    sub TEXT NOT NULL,
    auth_time BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX browser_sessions_sub ON browser_sessions (sub);
CREATE INDEX browser_sessions_expires_at ON browser_sessions (expires_at);

-- params is JSON kept as text: json.dumps escapes every character that
-- PostgreSQL's text and jsonb types cannot hold.
CREATE TABLE pending_authorizations (
    request_id TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    params TEXT NOT NULL,
    csrf_token TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX pending_authorizations_expires_at ON pending_authorizations (expires_at);

-- A grant is the family of every code and token issued from one
-- authorization: revoking it (revoked_at) makes all of them inactive, which
-- lookups see by joining the grant.
CREATE TABLE grants (
    grant_id TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,
    scope TEXT NOT NULL,
    resource TEXT[] NOT NULL,
    auth_time BIGINT NOT NULL,
    sid TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX grants_sub ON grants (sub);
CREATE INDEX grants_expires_at ON grants (expires_at);
CREATE INDEX grants_revoked_at ON grants (revoked_at) WHERE revoked_at IS NOT NULL;
CREATE INDEX grants_sid ON grants (sid) WHERE sid IS NOT NULL;

CREATE TABLE authorization_codes (
    code_hash TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL REFERENCES grants (grant_id) ON DELETE CASCADE,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,
    redirect_uri TEXT NOT NULL,
    scope TEXT NOT NULL,
    code_challenge TEXT NOT NULL,
    code_challenge_method TEXT NOT NULL,
    nonce TEXT,
    resource TEXT[] NOT NULL,
    auth_time BIGINT NOT NULL,
    sid TEXT,
    issued_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at BIGINT
);
CREATE INDEX authorization_codes_grant_id ON authorization_codes (grant_id);
CREATE INDEX authorization_codes_expires_at ON authorization_codes (expires_at);

CREATE TABLE access_tokens (
    token_hash TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL REFERENCES grants (grant_id) ON DELETE CASCADE,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,
    scope TEXT NOT NULL,
    audience TEXT[] NOT NULL,
    jti TEXT,
    issued_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX access_tokens_grant_id ON access_tokens (grant_id);
CREATE INDEX access_tokens_expires_at ON access_tokens (expires_at);

-- A consumed refresh token stays (consumed_at set) until it expires, so that
-- a second use is recognised as a replay (before grace_until, answered with
-- the encrypted replay) or as reuse (after it: the grant is revoked).
-- Refresh tokens are revoked only with their grant.
CREATE TABLE refresh_tokens (
    token_hash TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL REFERENCES grants (grant_id) ON DELETE CASCADE,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,
    scope TEXT NOT NULL,
    issued_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    consumed_at BIGINT,
    grace_until BIGINT,
    replay BYTEA
);
CREATE INDEX refresh_tokens_grant_id ON refresh_tokens (grant_id);
CREATE INDEX refresh_tokens_expires_at ON refresh_tokens (expires_at);
CREATE INDEX refresh_tokens_replay ON refresh_tokens (grace_until) WHERE replay IS NOT NULL;

CREATE TABLE consents (
    sub TEXT NOT NULL,
    client_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (sub, client_id)
);

CREATE TABLE bans (
    sub TEXT PRIMARY KEY,
    reason TEXT,
    created_at BIGINT NOT NULL,
    until BIGINT
);
CREATE INDEX bans_until ON bans (until) WHERE until IS NOT NULL;

-- Provider tokens arrive already encrypted; version supports compare-and-swap.
CREATE TABLE linked_accounts (
    account_id TEXT PRIMARY KEY,
    sub TEXT NOT NULL,
    provider TEXT NOT NULL,
    provider_user_id TEXT NOT NULL,
    access_token_enc BYTEA NOT NULL,
    refresh_token_enc BYTEA,
    scope TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    version BIGINT NOT NULL,
    UNIQUE (sub, provider)
);

-- The per-account refresh lease, shared by every instance: a row of its own,
-- so that taking it is one upsert that never touches the token version.
CREATE TABLE link_locks (
    account_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until BIGINT NOT NULL
);
CREATE INDEX link_locks_until ON link_locks (until);
