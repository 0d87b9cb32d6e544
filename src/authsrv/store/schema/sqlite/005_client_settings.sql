-- Who made each client (the config file's are removed with it), and its own
-- refresh grace window, rate limit and the audiences it serves.
ALTER TABLE clients ADD COLUMN source TEXT NOT NULL DEFAULT 'operator';
ALTER TABLE clients ADD COLUMN refresh_grace INTEGER;
ALTER TABLE clients ADD COLUMN rate_limit TEXT;
ALTER TABLE clients ADD COLUMN audiences TEXT NOT NULL DEFAULT '[]';
