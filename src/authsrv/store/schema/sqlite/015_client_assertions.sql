-- How a client authenticates at the token endpoint (NULL: by its secret, or
-- as a public client), its public keys for private_key_jwt (a JWK set inline,
-- or where to fetch it), and the scopes it may ask for client_credentials.
ALTER TABLE clients ADD COLUMN token_endpoint_auth_method TEXT;
ALTER TABLE clients ADD COLUMN jwks TEXT;
ALTER TABLE clients ADD COLUMN jwks_uri TEXT;
ALTER TABLE clients ADD COLUMN scopes TEXT NOT NULL DEFAULT '[]';
-- The jti of every client assertion used, until it expires: an assertion
-- authenticates once (RFC 7523 section 3, item 7).
CREATE TABLE client_assertions (
    client_id TEXT NOT NULL,
    jti TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (client_id, jti)
) WITHOUT ROWID;
CREATE INDEX client_assertions_expires_at ON client_assertions (expires_at);
