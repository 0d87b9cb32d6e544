-- Device authorization requests (RFC 8628) under the hashes of their device
-- and user codes: pending, then approved (with the grant it started) or
-- denied, then redeemed once; the polling interval grows with slow_down.
CREATE TABLE device_authorizations (
    device_code_hash TEXT PRIMARY KEY,
    user_code_hash TEXT NOT NULL UNIQUE,
    client_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    resource TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    poll_interval INTEGER NOT NULL,
    status TEXT NOT NULL,
    polled_at INTEGER,
    sub TEXT,
    grant_id TEXT
) WITHOUT ROWID;
CREATE INDEX device_authorizations_expires_at ON device_authorizations (expires_at);

-- An interaction that signs a user in for the device verification page
-- returns there instead of issuing a code.
ALTER TABLE interactions ADD COLUMN device INTEGER NOT NULL DEFAULT 0;
