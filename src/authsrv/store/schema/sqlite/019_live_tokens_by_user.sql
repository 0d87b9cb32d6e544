-- user-access asks whether a user holds a live token: start from the user's
-- unrevoked access tokens and unconsumed refresh tokens, so the many spent
-- grants a user gathers over the years are never read (authsrv.store.rows).
CREATE INDEX access_tokens_live_sub ON access_tokens (sub, expires_at) WHERE revoked_at IS NULL;
CREATE INDEX refresh_tokens_live_sub ON refresh_tokens (sub, expires_at) WHERE consumed_at IS NULL;
