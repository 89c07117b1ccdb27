-- Keys that replaced an expired one since 0009 (downstream_scheme 3) derive
-- their downstream keys from a fingerprint that binds the generation; a
-- binary of version 8 would hash the generation in again and send its
-- provider another key than the earlier attempt did. Refuse while any
-- unfinished key has scheme 3 (SQLSTATE IDEM1, migrations.ErrRefused): let
-- them finish, or reconcile them, first.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_keys WHERE status <> 'finished' AND downstream_scheme = 3) THEN
        RAISE EXCEPTION 'idem: unfinished keys replaced expired ones since 0009 (downstream_scheme 3); reverting 0009 would change the keys their retries send to providers: let them finish, or reconcile them, first'
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;
-- Without payload_fingerprint, the other keys compare by fingerprint, which
-- holds what the earlier releases compare (the input scheme), or, for keys
-- made before this migration, the payload fingerprint itself. Their
-- downstream keys derive from fingerprint either way, so none of them sends
-- anything different. A retry of a key made here, across a deploy that
-- changed the flow's input type, may then be answered 422 (key reused), as
-- before this migration, and a retry-only request no longer finds it.
DROP FUNCTION {{schema}}idem_acquire_v9(timestamptz, text, text, text, text, text, bytea, bytea, text, bigint, boolean, text, text, text, int, text);
ALTER TABLE {{schema}}idem_keys DROP COLUMN payload_fingerprint;
