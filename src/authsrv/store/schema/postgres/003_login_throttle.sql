-- authsrv PostgreSQL schema, version 3.
--
-- The login throttle: one row for each attempt still counted as a failure,
-- with an index for each of its three counts (per account and address, per
-- address, per account) and one for housekeeping; an attempt's id is its
-- ticket. Known devices are the browsers that signed in to an account
-- before (the hash of their cookie's value).

CREATE TABLE login_attempts (
    attempt_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account TEXT NOT NULL,
    address TEXT NOT NULL,
    at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX login_attempts_pair ON login_attempts (account, address, expires_at) INCLUDE (at);
CREATE INDEX login_attempts_address ON login_attempts (address, expires_at);
CREATE INDEX login_attempts_account ON login_attempts (account, expires_at);
CREATE INDEX login_attempts_expires_at ON login_attempts (expires_at);

CREATE TABLE known_devices (
    account TEXT NOT NULL,
    device_hash TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (account, device_hash)
);
CREATE INDEX known_devices_expires_at ON known_devices (expires_at);
