-- A login-stage interaction records the client address that asked, so that
-- one address can keep only so many sign-ins waiting; the index finds an
-- address's live ones.
ALTER TABLE interactions ADD COLUMN address TEXT;
CREATE INDEX interactions_address ON interactions (address, expires_at) WHERE address IS NOT NULL;
