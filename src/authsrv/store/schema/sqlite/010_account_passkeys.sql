-- The account page names each session's device and address and when it was
-- last used.
ALTER TABLE browser_sessions ADD COLUMN user_agent TEXT;
ALTER TABLE browser_sessions ADD COLUMN address TEXT;
ALTER TABLE browser_sessions ADD COLUMN last_seen INTEGER;

-- Passkeys (WebAuthn credentials) under the user's stable id: the COSE
-- public key, the last sign counter (a clone's counter falls behind), the
-- backup flags and the transports the browser reported.
CREATE TABLE passkeys (
    credential_id TEXT PRIMARY KEY,
    sub TEXT NOT NULL,
    public_key BLOB NOT NULL,
    sign_count INTEGER NOT NULL,
    backup_eligible INTEGER NOT NULL,
    backup_state INTEGER NOT NULL,
    transports TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_used INTEGER
) WITHOUT ROWID;
CREATE INDEX passkeys_sub ON passkeys (sub);

-- WebAuthn challenges in flight, by hash: each is taken once.
CREATE TABLE passkey_challenges (
    challenge_hash TEXT PRIMARY KEY,
    purpose TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX passkey_challenges_expires_at ON passkey_challenges (expires_at);
