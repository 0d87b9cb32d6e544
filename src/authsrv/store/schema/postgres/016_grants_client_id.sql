-- Removing a client deletes its grants: find them without a scan.
CREATE INDEX grants_client_id ON grants (client_id);
