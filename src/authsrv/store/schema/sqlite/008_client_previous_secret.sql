-- The secret a rotation replaced, accepted until previous_secret_until so
-- that apps switch to the new one without downtime.
ALTER TABLE clients ADD COLUMN previous_secret_hash TEXT;
ALTER TABLE clients ADD COLUMN previous_secret_until INTEGER;
