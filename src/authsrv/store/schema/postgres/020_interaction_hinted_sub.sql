-- A waiting authorization request keeps the user its id_token_hint named,
-- so that the sign-in it asks for gives a code only to that user.
ALTER TABLE interactions ADD COLUMN hinted_sub TEXT;
