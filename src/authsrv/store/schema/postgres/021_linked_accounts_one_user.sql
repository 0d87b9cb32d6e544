-- One chat-platform account is linked to one user at most: otherwise two
-- users' chat_user_id claims name the same account, and a first-party
-- service mapping a chat user to its user cannot tell which one is meant.
-- The store enforces it with this index: of two links racing for one
-- provider account, the second fails (authsrv.store.postgres, link_account).
--
-- A deployment may already hold such duplicates, which the index would
-- refuse. Of each provider account's links, the most recently updated one
-- (linked or refreshed last; the greater account_id on a tie) is kept and
-- the others are deleted, so the upgrade never fails: their users lose the
-- link and its tokens, and link again once the chat account is theirs
-- (docs/design.md, Linked chat accounts).
DELETE FROM linked_accounts
WHERE EXISTS (
    SELECT 1 FROM linked_accounts AS kept
    WHERE kept.provider = linked_accounts.provider
      AND kept.provider_user_id = linked_accounts.provider_user_id
      AND (kept.updated_at > linked_accounts.updated_at
           OR (kept.updated_at = linked_accounts.updated_at
               AND kept.account_id COLLATE "C" > linked_accounts.account_id COLLATE "C"))
);
CREATE UNIQUE INDEX linked_accounts_provider_account ON linked_accounts (provider, provider_user_id);
