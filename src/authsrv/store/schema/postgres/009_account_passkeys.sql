-- The account page names each session's device and address and when it was
-- last used.
ALTER TABLE browser_sessions ADD COLUMN user_agent TEXT;
ALTER TABLE browser_sessions ADD COLUMN address TEXT;
ALTER TABLE browser_sessions ADD COLUMN last_seen BIGINT;

-- Passkeys (WebAuthn credentials) under the user's stable id: the COSE
-- public key, the last sign counter (a clone's counter falls behind), the
-- backup flags and the transports the browser reported.
CREATE TABLE passkeys (
    credential_id TEXT PRIMARY KEY,
    sub TEXT NOT NULL,
    public_key BYTEA NOT NULL,
    sign_count BIGINT NOT NULL,
    backup_eligible BOOLEAN NOT NULL,
    backup_state BOOLEAN NOT NULL,
    transports TEXT[] NOT NULL,
    created_at BIGINT NOT NULL,
    last_used BIGINT
);
CREATE INDEX passkeys_sub ON passkeys (sub);

-- WebAuthn challenges in flight, by hash: each is taken once.
CREATE TABLE passkey_challenges (
    challenge_hash TEXT PRIMARY KEY,
    purpose TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX passkey_challenges_expires_at ON passkey_challenges (expires_at);
