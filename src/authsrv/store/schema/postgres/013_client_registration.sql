-- The hash of the registration access token of a client that registered
-- itself (RFC 7591/7592), so that it can read or delete its registration.
ALTER TABLE clients ADD COLUMN registration_token_hash TEXT;
