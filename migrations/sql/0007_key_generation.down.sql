-- Without the generation, a key in flight that replaced an expired one
-- (generation > 0) would derive the downstream keys of the old request it
-- replaced: its retry would send its provider another key than its earlier
-- attempt did, and the provider would answer with the old request's result,
-- or act twice. Refuse while any unfinished key has a generation (SQLSTATE
-- IDEM1, migrations.ErrRefused): let them finish, or reconcile them, first.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_keys WHERE status <> 'finished' AND generation > 0) THEN
        RAISE EXCEPTION 'idem: unfinished keys replaced expired ones (generation > 0) and derive their downstream idempotency keys from it; reverting 0007 would change the keys their retries send to providers: let them finish, or reconcile them, first'
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;
DROP FUNCTION {{schema}}idem_acquire_v7(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text);
ALTER TABLE {{schema}}idem_keys DROP COLUMN generation;
