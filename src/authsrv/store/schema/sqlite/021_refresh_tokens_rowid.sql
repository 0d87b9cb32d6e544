-- A rotated refresh token keeps its sealed replay (about 1.3 KB) for the
-- grace window. In a WITHOUT ROWID table, whose rows live in the key's
-- B-tree, a row longer than about a quarter of a page spills into an
-- overflow page: every rotation allocated one and every purge freed it. As
-- an ordinary table the row stays in its page, and the token's hash finds
-- it through the primary key's index. The table is rebuilt with the same
-- columns and indexes (SQLite cannot change a table's kind in place);
-- nothing references it, so the foreign keys stay on.
CREATE TABLE refresh_tokens_rebuilt (
    token_hash TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL REFERENCES grants (grant_id) ON DELETE CASCADE,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,
    scope TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    consumed_at INTEGER,
    grace_until INTEGER,
    replay BLOB,
    jkt TEXT
);
INSERT INTO refresh_tokens_rebuilt
    (token_hash, grant_id, client_id, sub, scope, issued_at, expires_at, consumed_at, grace_until, replay, jkt)
    SELECT token_hash, grant_id, client_id, sub, scope, issued_at, expires_at, consumed_at, grace_until, replay, jkt
    FROM refresh_tokens;
DROP TABLE refresh_tokens;
ALTER TABLE refresh_tokens_rebuilt RENAME TO refresh_tokens;
CREATE INDEX refresh_tokens_grant_id ON refresh_tokens (grant_id);
CREATE INDEX refresh_tokens_expires_at ON refresh_tokens (expires_at);
CREATE INDEX refresh_tokens_replay ON refresh_tokens (grace_until) WHERE replay IS NOT NULL;
CREATE INDEX refresh_tokens_live_sub ON refresh_tokens (sub, expires_at) WHERE consumed_at IS NULL;
