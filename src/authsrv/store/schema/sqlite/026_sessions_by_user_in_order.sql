-- The admin API pages through a user's live browser sessions oldest first,
-- continued after the last (created_at, sid) shown: this index reads one
-- page, where the index on sub alone left SQLite to sort every session of
-- the user for each page. It replaces that index, which every lookup by sub
-- alone finds in its first column, so a new session still writes as many
-- indexes as before.
CREATE INDEX browser_sessions_by_sub ON browser_sessions (sub, created_at, sid);
DROP INDEX browser_sessions_sub;
