-- The admin API pages through a user's live grants oldest first, continued
-- after the last (created_at, grant_id) shown: this index reads one page,
-- where the index on sub alone leaves PostgreSQL to sort every grant of the
-- user (one per sign-in over the years) for each page.
CREATE INDEX grants_live_by_sub ON grants (sub, created_at, grant_id COLLATE "C") WHERE revoked_at IS NULL;
