-- Without the key ids, a sealed params or response body would read as if it
-- were stored in the clear: refuse while any row is sealed.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_keys WHERE params_key_id IS NOT NULL OR response_key_id IS NOT NULL) THEN
        RAISE EXCEPTION 'idem: some keys are sealed at rest (params_key_id, response_key_id); reverting 0003 would make them unreadable: let them expire and be reaped, or delete them, first';
    END IF;
END
$$;
ALTER TABLE {{schema}}idem_keys DROP COLUMN params_key_id, DROP COLUMN response_key_id;
