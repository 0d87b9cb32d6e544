-- The server's own random keys (client secret hashes are keyed with one),
-- made on first use and shared by everything that opens the store.
CREATE TABLE server_keys (
    name TEXT PRIMARY KEY,
    key BLOB NOT NULL
);
