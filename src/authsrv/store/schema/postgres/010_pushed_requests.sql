-- Pushed authorization requests (RFC 9126): kept under the hash of the
-- request_uri handed to the client, with the parameters form-encoded as
-- pushed, until the browser brings the request_uri once or it expires.
CREATE TABLE pushed_requests (
    uri_hash TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    query TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX pushed_requests_expires_at ON pushed_requests (expires_at);

-- A client may be held to pushed requests only, and to a security profile.
ALTER TABLE clients ADD COLUMN require_pushed_authorization_requests BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE clients ADD COLUMN profile TEXT;
