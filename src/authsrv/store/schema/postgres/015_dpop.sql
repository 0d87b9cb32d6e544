-- DPoP (RFC 9449): the key thumbprint (RFC 7638) a token is bound to, kept
-- in the token's own row so that the one lookup that finds a token also
-- says whether a proof must come with it; the clients that must use DPoP;
-- the authorization code bound to a key by the authorize request's dpop_jkt;
-- and the proofs already seen (their jti), each kept until it is too old to
-- be accepted anyway.
ALTER TABLE access_tokens ADD COLUMN jkt TEXT;
ALTER TABLE refresh_tokens ADD COLUMN jkt TEXT;
ALTER TABLE authorization_codes ADD COLUMN dpop_jkt TEXT;
ALTER TABLE interactions ADD COLUMN dpop_jkt TEXT;
ALTER TABLE clients ADD COLUMN dpop_bound_access_tokens BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE dpop_proofs (
    jti_hash TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX dpop_proofs_expires_at ON dpop_proofs (expires_at);
