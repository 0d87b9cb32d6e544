-- The admin API pages through a user's live grants oldest first, continued
-- after the last (created_at, grant_id) shown: this index reads one page,
-- where the index on sub alone left SQLite to sort every grant of the user
-- (one per sign-in over the years) for each page. It replaces that index,
-- which every lookup by sub alone finds in its first column, so a new grant
-- still writes as many indexes as before.
CREATE INDEX grants_by_sub ON grants (sub, created_at, grant_id);
DROP INDEX grants_sub;
