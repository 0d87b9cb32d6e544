-- Clients by how they came to be, so that counting the clients that
-- registered themselves ([registration] max_clients, checked at every
-- registration) reads the index rather than every client.
CREATE INDEX clients_source ON clients (source);
