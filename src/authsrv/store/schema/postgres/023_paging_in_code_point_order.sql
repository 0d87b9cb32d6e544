-- The admin API pages through clients and bans in code point order
-- (COLLATE "C", as every listing here), continued after the last key:
-- these indexes read one page, where the primary keys, in the database's
-- own collation, leave PostgreSQL to sort every row for each page.
CREATE INDEX clients_by_code_point ON clients (client_id COLLATE "C");
CREATE INDEX bans_by_code_point ON bans (sub COLLATE "C");
