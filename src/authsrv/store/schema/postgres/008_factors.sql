-- Second factors, kept in authsrv's own store under the user's stable id so
-- a read-only directory is enough: a TOTP secret (sealed with a server key)
-- with the last time step a code was accepted for, the hashes of unused
-- recovery codes, and when a policy first asked a user without factors to
-- enrol (the grace period runs from then).
CREATE TABLE totp_factors (
    sub TEXT PRIMARY KEY,
    secret_enc BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    last_step BIGINT NOT NULL
);

CREATE TABLE recovery_codes (
    sub TEXT NOT NULL,
    code_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (sub, code_hash)
);

CREATE TABLE mfa_demands (
    sub TEXT PRIMARY KEY,
    first_at BIGINT NOT NULL
);

-- How each session, code and grant authenticated (RFC 8176 methods and the
-- context class); everything before this step was a password sign-in.
ALTER TABLE browser_sessions ADD COLUMN amr TEXT[] NOT NULL DEFAULT '{pwd}';
ALTER TABLE browser_sessions ADD COLUMN acr TEXT NOT NULL DEFAULT 'urn:authsrv:acr:pwd';
ALTER TABLE authorization_codes ADD COLUMN amr TEXT[] NOT NULL DEFAULT '{pwd}';
ALTER TABLE authorization_codes ADD COLUMN acr TEXT NOT NULL DEFAULT 'urn:authsrv:acr:pwd';
ALTER TABLE grants ADD COLUMN amr TEXT[] NOT NULL DEFAULT '{pwd}';
ALTER TABLE grants ADD COLUMN acr TEXT NOT NULL DEFAULT 'urn:authsrv:acr:pwd';

-- A sign-in's requested context classes, and past the password the user
-- and the methods already used.
ALTER TABLE interactions ADD COLUMN acr_values TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE interactions ADD COLUMN sub TEXT;
ALTER TABLE interactions ADD COLUMN amr TEXT[] NOT NULL DEFAULT '{}';

ALTER TABLE clients ADD COLUMN require_mfa BOOLEAN NOT NULL DEFAULT FALSE;
