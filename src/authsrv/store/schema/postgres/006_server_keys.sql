-- The server's own random keys (client secret hashes are keyed with one),
-- made on first use and shared by every instance.
CREATE TABLE server_keys (
    name TEXT PRIMARY KEY,
    key BYTEA NOT NULL
);
