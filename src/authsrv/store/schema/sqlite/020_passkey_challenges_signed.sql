-- A passkey challenge now carries its own end and an HMAC of its purpose
-- (authsrv.flows.passkeys): showing one stores nothing, and an answered one
-- is used up in dpop_proofs, the single-use record. Challenges in flight at
-- the upgrade fail once, and the person asks for a new one.
DROP TABLE passkey_challenges;
