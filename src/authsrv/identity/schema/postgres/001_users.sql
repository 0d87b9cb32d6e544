-- The users of the PostgreSQL identity backend in its own-schema mode.
-- login_key is the login as authsrv compares it (NFC, case-folded, computed
-- by authsrv): it keeps logins unique whatever the database's collation.
CREATE TABLE identity_users (
    sub text PRIMARY KEY CHECK (sub <> '' AND length(sub) <= 255),
    login text NOT NULL CHECK (btrim(login) <> ''),
    login_key text NOT NULL UNIQUE,
    password_hash text NOT NULL,
    name text,
    picture text,
    email text,
    email_verified boolean NOT NULL DEFAULT false,
    disabled boolean NOT NULL DEFAULT false,
    disabled_reason text,
    chat_user_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
