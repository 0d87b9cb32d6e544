-- client_secret_jwt (RFC 7523): the secret of a client that authenticates
-- with an HMAC assertion, sealed under the key of [client_secrets]
-- (authsrv.client_secrets); NULL for every other client.
ALTER TABLE clients ADD COLUMN sealed_secret BYTEA;
