-- pgstore.Config.Cipher seals a key's params and its response body at rest
-- (AES-256-GCM). These columns name the key of the keyring each was sealed
-- with; NULL means stored in the clear (rows written without a cipher). A
-- sealed params is stored as a JSON string of the base64 ciphertext. Naming
-- the key per row lets keys rotate: new values take the current key, and a
-- row keeps opening with the key it names for as long as the keyring holds
-- it. Adding nullable columns rewrites nothing.
ALTER TABLE {{schema}}idem_keys ADD COLUMN params_key_id text, ADD COLUMN response_key_id text;
