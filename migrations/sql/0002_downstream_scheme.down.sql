ALTER TABLE {{schema}}idem_keys DROP COLUMN downstream_scheme;
