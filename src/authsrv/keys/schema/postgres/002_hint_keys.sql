-- The public part of keys withdrawn from the JWKS, kept to verify the
-- id_token_hints they signed until expires_at; never published, never signing.
-- A table of its own, so instances still on version 1 read signing_keys as before.
CREATE TABLE signing_key_hints (
    kid text PRIMARY KEY,
    alg text NOT NULL,
    expires_at bigint NOT NULL,
    public_jwk text NOT NULL
);
