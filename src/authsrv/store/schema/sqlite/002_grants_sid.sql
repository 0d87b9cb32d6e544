-- authsrv SQLite schema, version 2.
--
-- Back-channel logout finds the clients of an ended browser session by the
-- sid its grants carry.

CREATE INDEX grants_sid ON grants (sid) WHERE sid IS NOT NULL;
