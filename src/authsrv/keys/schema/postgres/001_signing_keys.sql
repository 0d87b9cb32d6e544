-- Signing keys shared by every instance. private_jwk holds the private JWK
-- as JSON text, or sealed with AES-256-GCM when encrypted is true.
CREATE TABLE signing_keys (
    kid text PRIMARY KEY,
    alg text NOT NULL,
    state text NOT NULL CHECK (state IN ('next', 'active', 'retired')),
    created_at bigint NOT NULL,
    activated_at bigint,
    retired_at bigint,
    expires_at bigint,
    encrypted boolean NOT NULL,
    private_jwk bytea NOT NULL
);
