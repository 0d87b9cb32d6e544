-- The algorithms a client's ID tokens and JWT access tokens are signed with,
-- and its signed UserInfo responses' (NULL: plain JSON).
ALTER TABLE clients ADD COLUMN id_token_signed_response_alg TEXT NOT NULL DEFAULT 'RS256';
ALTER TABLE clients ADD COLUMN access_token_signed_response_alg TEXT NOT NULL DEFAULT 'RS256';
ALTER TABLE clients ADD COLUMN userinfo_signed_response_alg TEXT;
